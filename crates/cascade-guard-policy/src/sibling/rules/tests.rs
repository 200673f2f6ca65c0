use serde_json::json;

use super::*;
use crate::sibling::edge::Provenance;
use crate::sibling::graph::{Graph, ReadProblemReason};
use crate::sibling::needs_annotation::COMPOSITION_RESOURCE_NAME_ANNOTATION;
use crate::sibling::test_objects::*;

fn edge_names(g: &Graph) -> Vec<(String, String, Provenance)> {
    let mut got: Vec<_> = g
        .edges
        .iter()
        .map(|e| (e.object.name.clone(), e.needs.name.clone(), e.provenance))
        .collect();
    got.sort();
    got
}

/// What, the objects (the first is the root), the edges by name, the problems.
type RuleCase = (
    &'static str,
    Vec<Value>,
    Vec<(&'static str, &'static str, Provenance)>,
    Vec<ReadProblemReason>,
);

fn rule_cases() -> Vec<RuleCase> {
    [
        resolved_reference_cases(),
        provider_config_cases(),
        secret_cases(),
        usage_and_object_cases(),
        annotation_and_owner_cases(),
    ]
    .concat()
}

/// Upjet's resolved references.
fn resolved_reference_cases() -> Vec<RuleCase> {
    use Provenance::*;
    use ReadProblemReason::*;
    let root = xr("XNet", None, "root");
    let ec2 = |kind: &str, name: &str, for_provider: Value| {
        spec(
            obj("ec2.aws.upbound.io/v1beta1", kind, None, name),
            json!({"forProvider": for_provider}),
        )
    };
    vec![
        (
            "a resolved reference: a Subnet's vpcIdRef, by name among its provider's objects",
            vec![
                root.clone(),
                under(ec2("VPC", "net", json!({})), &root),
                under(
                    ec2("Subnet", "sub", json!({"vpcIdRef": {"name": "net"}})),
                    &root,
                ),
                // Another provider's object of that name is not it.
                under(obj("v1", "ConfigMap", None, "net"), &root),
            ],
            vec![("sub", "net", ResolvedReference)],
            vec![],
        ),
        (
            "resolved references: two of that name, none, a selector alone",
            vec![
                root.clone(),
                under(ec2("VPC", "net", json!({})), &root),
                under(ec2("InternetGateway", "net", json!({})), &root),
                under(
                    ec2(
                        "Subnet",
                        "sub",
                        json!({
                            "vpcIdRef": {"name": "net"},
                            "zoneRef": {"name": "gone"},
                            "clusterNameSelector": {"matchControllerRef": true},
                        }),
                    ),
                    &root,
                ),
            ],
            vec![],
            vec![Unresolvable, Unresolvable, Unresolved],
        ),
    ]
}

/// spec.providerConfigRef.
fn provider_config_cases() -> Vec<RuleCase> {
    use Provenance::*;
    use ReadProblemReason::*;
    let root = xr("XNet", None, "root");
    let team_root = xr("XNet", Some("team"), "root");
    vec![
        (
            "providerConfigRef: kind defaults to ProviderConfig, cluster-scoped",
            vec![
                root.clone(),
                under(pc("aws.upbound.io/v1beta1", None, "default"), &root),
                under(
                    mr(
                        "VPC",
                        None,
                        "vpc",
                        json!({"providerConfigRef": {"name": "default"}}),
                    ),
                    &root,
                ),
            ],
            vec![("vpc", "default", ProviderConfigRef)],
            vec![],
        ),
        (
            "providerConfigRef: a ClusterProviderConfig from a namespaced resource",
            vec![
                team_root.clone(),
                obj(
                    "aws.m.upbound.io/v1beta1",
                    "ClusterProviderConfig",
                    None,
                    "shared",
                ),
                under(
                    mr(
                        "VPC",
                        Some("team"),
                        "vpc",
                        json!({"providerConfigRef": {"name": "shared", "kind": "ClusterProviderConfig"}}),
                    ),
                    &team_root,
                ),
            ],
            vec![("vpc", "shared", ProviderConfigRef)],
            vec![],
        ),
        (
            "providerConfigRef: a namespaced ProviderConfig in the resource's namespace",
            vec![
                team_root.clone(),
                pc("aws.m.upbound.io/v1beta1", Some("team"), "p"),
                pc("aws.m.upbound.io/v1beta1", Some("other"), "p"),
                under(
                    mr(
                        "VPC",
                        Some("team"),
                        "vpc",
                        json!({"providerConfigRef": {"name": "p", "kind": "ProviderConfig"}}),
                    ),
                    &team_root,
                ),
            ],
            vec![("vpc", "p", ProviderConfigRef)],
            vec![],
        ),
        (
            "providerConfigRef: every API group with that kind and name",
            vec![
                root.clone(),
                pc("helm.crossplane.io/v1beta1", None, "prod"),
                pc("kubernetes.crossplane.io/v1alpha1", None, "prod"),
                under(
                    mr(
                        "VPC",
                        None,
                        "vpc",
                        json!({"providerConfigRef": {"name": "prod"}}),
                    ),
                    &root,
                ),
            ],
            vec![
                ("vpc", "prod", ProviderConfigRef),
                ("vpc", "prod", ProviderConfigRef),
            ],
            vec![],
        ),
        (
            "providerConfigRef: naming nothing is a problem",
            vec![
                root.clone(),
                under(
                    mr(
                        "VPC",
                        None,
                        "vpc",
                        json!({"providerConfigRef": {"name": "missing"}}),
                    ),
                    &root,
                ),
            ],
            vec![],
            vec![Unresolved],
        ),
    ]
}

/// Credentials and connection Secrets.
fn secret_cases() -> Vec<RuleCase> {
    use Provenance::*;
    let root = xr("XNet", None, "root");
    let team_root = xr("XNet", Some("team"), "root");
    vec![
        (
            "credentials.secretRef with a namespace",
            vec![
                root.clone(),
                under(
                    spec(
                        pc("helm.crossplane.io/v1beta1", None, "helm"),
                        json!({"credentials": {"source": "Secret",
                               "secretRef": {"name": "kc", "namespace": "crossplane-system", "key": "k"}}}),
                    ),
                    &root,
                ),
                secret("crossplane-system", "kc"),
            ],
            vec![("helm", "kc", CredentialsSecretRef)],
            vec![],
        ),
        (
            "credentials.secretRef in the ProviderConfig's own namespace",
            vec![
                team_root.clone(),
                under(
                    spec(
                        pc("helm.m.crossplane.io/v1beta1", Some("team"), "helm"),
                        json!({"credentials": {"secretRef": {"name": "kc"}}}),
                    ),
                    &team_root,
                ),
                secret("team", "kc"),
            ],
            vec![("helm", "kc", CredentialsSecretRef)],
            vec![],
        ),
        (
            "writeConnectionSecretToRef with a namespace: the Secret needs its writer",
            vec![
                root.clone(),
                under(
                    mr(
                        "Cluster",
                        None,
                        "prod",
                        json!({"writeConnectionSecretToRef": {"name": "conn", "namespace": "crossplane-system"}}),
                    ),
                    &root,
                ),
                secret("crossplane-system", "conn"),
            ],
            vec![("conn", "prod", WriteConnectionSecretToRef)],
            vec![],
        ),
        (
            "writeConnectionSecretToRef in the writer's namespace",
            vec![
                team_root.clone(),
                under(
                    mr(
                        "Cluster",
                        Some("team"),
                        "prod",
                        json!({"writeConnectionSecretToRef": {"name": "conn"}}),
                    ),
                    &team_root,
                ),
                secret("team", "conn"),
                secret("other", "conn"),
            ],
            vec![("conn", "prod", WriteConnectionSecretToRef)],
            vec![],
        ),
        (
            "a Secret needs its controller owner",
            vec![
                root.clone(),
                under(mr("Cluster", None, "prod", json!({})), &root),
                under(
                    secret("crossplane-system", "conn"),
                    &mr("Cluster", None, "prod", json!({})),
                ),
            ],
            vec![("conn", "prod", SecretController)],
            vec![],
        ),
    ]
}

/// Crossplane Usages and provider-kubernetes Objects.
fn usage_and_object_cases() -> Vec<RuleCase> {
    use Provenance::*;
    use ReadProblemReason::*;
    let root = xr("XNet", None, "root");
    let team_root = xr("XNet", Some("team"), "root");
    let usage_spec = |of_ns: Option<&str>, by_ns: Option<&str>| {
        let side = |kind: &str, name: &str, ns: Option<&str>| {
            let mut s = json!({"apiVersion": "example.org/v1", "kind": kind,
                               "resourceRef": {"name": name}});
            if let Some(ns) = ns {
                s["resourceRef"]["namespace"] = json!(ns);
            }
            s
        };
        json!({"of": side("XDb", "db", of_ns), "by": side("XApp", "app", by_ns)})
    };
    vec![
        (
            "Usage (protection.crossplane.io, namespaced): by needs of",
            vec![
                team_root.clone(),
                under(xr("XApp", Some("team"), "app"), &team_root),
                under(xr("XDb", Some("team"), "db"), &team_root),
                under(
                    spec(
                        obj(
                            "protection.crossplane.io/v1beta1",
                            "Usage",
                            Some("team"),
                            "u",
                        ),
                        usage_spec(None, None),
                    ),
                    &team_root,
                ),
            ],
            vec![("app", "db", Usage)],
            vec![],
        ),
        (
            "ClusterUsage",
            vec![
                root.clone(),
                under(xr("XApp", None, "app"), &root),
                under(xr("XDb", None, "db"), &root),
                spec(
                    obj(
                        "protection.crossplane.io/v1beta1",
                        "ClusterUsage",
                        None,
                        "u",
                    ),
                    usage_spec(None, None),
                ),
            ],
            vec![("app", "db", Usage)],
            vec![],
        ),
        (
            "legacy Usage (apiextensions.crossplane.io, cluster-scoped)",
            vec![
                root.clone(),
                under(xr("XApp", None, "app"), &root),
                under(xr("XDb", None, "db"), &root),
                spec(
                    obj("apiextensions.crossplane.io/v1beta1", "Usage", None, "u"),
                    usage_spec(None, None),
                ),
            ],
            vec![("app", "db", Usage)],
            vec![],
        ),
        (
            "Usage with only a resourceSelector: unresolvable, not guessed",
            vec![
                root.clone(),
                under(xr("XApp", None, "app"), &root),
                under(xr("XDb", None, "db"), &root),
                spec(
                    obj("apiextensions.crossplane.io/v1beta1", "Usage", None, "u"),
                    json!({
                        "of": {"apiVersion": "example.org/v1", "kind": "XDb",
                               "resourceSelector": {"matchLabels": {"a": "b"}}},
                        "by": {"apiVersion": "example.org/v1", "kind": "XApp",
                               "resourceRef": {"name": "app"}},
                    }),
                ),
            ],
            vec![],
            vec![Unresolvable],
        ),
        (
            "provider-kubernetes Object: dependsOn and patchesFrom",
            vec![
                root.clone(),
                under(
                    spec(
                        obj("kubernetes.crossplane.io/v1alpha2", "Object", None, "o"),
                        json!({"references": [
                            {"dependsOn": {"apiVersion": "v1", "kind": "Namespace", "name": "apps"}},
                            {"patchesFrom": {"apiVersion": "v1", "kind": "ConfigMap",
                                             "name": "cfg", "namespace": "team",
                                             "fieldPath": "data.x"}},
                        ]}),
                    ),
                    &root,
                ),
                obj("v1", "Namespace", None, "apps"),
                obj("v1", "ConfigMap", Some("team"), "cfg"),
            ],
            vec![("o", "apps", DependsOn), ("o", "cfg", PatchesFrom)],
            vec![],
        ),
    ]
}

/// The needs annotation and blocking owners.
fn annotation_and_owner_cases() -> Vec<RuleCase> {
    use Provenance::*;
    use ReadProblemReason::*;
    let root = xr("XNet", None, "root");
    let team_root = xr("XNet", Some("team"), "root");
    vec![
        (
            "annotation: a composition resource name is a sibling",
            vec![
                root.clone(),
                under(
                    annotate(
                        xr("XCluster", None, "gen-x7k2"),
                        COMPOSITION_RESOURCE_NAME_ANNOTATION,
                        "cluster",
                    ),
                    &root,
                ),
                under(
                    annotate(xr("XApps", None, "gen-p9q1"), NEEDS_ANNOTATION, "cluster"),
                    &root,
                ),
            ],
            vec![("gen-p9q1", "gen-x7k2", Annotation)],
            vec![],
        ),
        (
            "annotation: Kind.group/name and Kind/name in the object's namespace",
            vec![
                team_root.clone(),
                under(xr("XDb", Some("team"), "db"), &team_root),
                secret("team", "s"),
                under(
                    annotate(
                        xr("XApp", Some("team"), "app"),
                        NEEDS_ANNOTATION,
                        " XDb.example.org/db , Secret/s,",
                    ),
                    &team_root,
                ),
            ],
            vec![("app", "db", Annotation), ("app", "s", Annotation)],
            vec![],
        ),
        (
            "annotation: Kind/namespace/name in another namespace",
            vec![
                team_root.clone(),
                secret("other", "s"),
                under(
                    annotate(
                        xr("XApp", Some("team"), "app"),
                        NEEDS_ANNOTATION,
                        "Secret/other/s",
                    ),
                    &team_root,
                ),
            ],
            vec![("app", "s", Annotation)],
            vec![],
        ),
        (
            "annotation: malformed entries and names of nothing are problems",
            vec![
                root.clone(),
                under(
                    annotate(
                        xr("XApp", None, "app"),
                        NEEDS_ANNOTATION,
                        "secret/x, A/b/c/d, no-such-resource, XDb.example.org/gone",
                    ),
                    &root,
                ),
            ],
            vec![],
            vec![Malformed, Malformed, Unresolved, Unresolved],
        ),
        (
            "a blocking ownerReference other than the parent",
            vec![
                root.clone(),
                under(xr("XDb", None, "db"), &root),
                also_owned(
                    under(xr("XApp", None, "app"), &root),
                    &xr("XDb", None, "db"),
                    true,
                ),
                also_owned(
                    under(xr("XLog", None, "log"), &root),
                    &xr("XDb", None, "db"),
                    false,
                ),
            ],
            vec![("app", "db", OwnerReference)],
            vec![],
        ),
    ]
}

#[test]
fn each_rule_reads_its_edges() {
    for (what, objects, want, problems) in rule_cases() {
        let g = graph_of(&objects);
        let mut want: Vec<_> = want
            .into_iter()
            .map(|(a, b, p)| (a.to_string(), b.to_string(), p))
            .collect();
        want.sort();
        assert_eq!(edge_names(&g), want, "{what}");
        let got: Vec<ReadProblemReason> = g.problems.iter().map(|p| p.reason).collect();
        assert_eq!(got, problems, "{what}: {:?}", g.problems);
    }
}

#[test]
fn a_provider_config_ref_prefers_its_providers_group() {
    let cases = [
        ("helm.m.crossplane.io", "helm.m.crossplane.io", true),
        ("ec2.aws.upbound.io", "aws.upbound.io", true),
        ("helm.m.crossplane.io", "kubernetes.m.crossplane.io", false),
        ("xaws.upbound.io", "aws.upbound.io", false),
        ("helm.crossplane.io", "", false),
    ];
    for (group, provider, want) in cases {
        assert_eq!(group_family(group, provider), want, "{group} {provider}");
    }
    let root = obj("example.org/v1", "XR", Some("ns"), "root");
    let mut release = under(
        obj("helm.m.crossplane.io/v1beta1", "Release", Some("ns"), "web"),
        &root,
    );
    release["spec"] = json!({"providerConfigRef": {"name": "conn"}});
    let helm = under(
        obj(
            "helm.m.crossplane.io/v1beta1",
            "ProviderConfig",
            Some("ns"),
            "conn",
        ),
        &root,
    );
    let kubernetes = under(
        obj(
            "kubernetes.m.crossplane.io/v1alpha1",
            "ProviderConfig",
            Some("ns"),
            "conn",
        ),
        &root,
    );
    let g = graph_of(&[root, release, helm, kubernetes]);
    let needed: Vec<&str> = g
        .edges
        .iter()
        .filter(|e| e.object.name == "web")
        .map(|e| e.needs.group.as_str())
        .collect();
    assert_eq!(needed, ["helm.m.crossplane.io"]);
}
