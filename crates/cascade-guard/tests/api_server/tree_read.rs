//! Reading a live tree (`cluster::tree::read_tree`, what `plan`, `status`
//! and sibling order read) by kind with lists, on the real control plane:
//! it holds exactly what the tree composes, whoever reads it (a reader who
//! may not list a kind, or may not read it at all, gets the same tree:
//! the first by GETs, the second by names alone), however many other
//! objects of the kind share the namespace; and a tree past the limit is cut
//! in the order it is read, with `plan` saying so and exiting 3.

use std::collections::BTreeSet;

use cascade_guard::cluster::kinds::ServedKinds;
use cascade_guard::cluster::tree::{Listed, TreeRead, UNREAD_ANNOTATION, read_tree};
use cascade_guard_testkit::tree::config_maps;
use cascade_guard_testkit::*;
use futures::StreamExt;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};
use local_cluster::testing::Scope;
use serde_json::{Value, json};

/// Creates in flight at once.
const CREATES_AT_ONCE: usize = 16;

/// Kind, namespace and name of each object read, and whether it was read
/// by its name alone (forbidden).
type Read = BTreeSet<(String, Option<String>, String, bool)>;

fn identities(read: &TreeRead) -> Read {
    read.objects
        .iter()
        .map(|o| {
            let text = |p: &str| o.pointer(p).and_then(Value::as_str).map(str::to_string);
            let by_name = o
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(UNREAD_ANNOTATION))
                .is_some();
            (
                text("/kind").unwrap_or_default(),
                text("/metadata/namespace"),
                text("/metadata/name").unwrap_or_default(),
                by_name,
            )
        })
        .collect()
}

fn expect<'a>(objects: impl IntoIterator<Item = (&'a str, &'a str, String, bool)>) -> Read {
    objects
        .into_iter()
        .map(|(kind, ns, name, by_name)| (kind.to_string(), Some(ns.to_string()), name, by_name))
        .collect()
}

/// `prefix-0` to `prefix-<n - 1>`.
fn names(prefix: &'static str, n: usize) -> impl Iterator<Item = String> {
    (0..n).map(move |i| format!("{prefix}-{i}"))
}

/// A resourceRefs entry; `namespace` where it is not the XR's.
fn entry(kind: &str, name: &str, namespace: Option<&str>) -> Value {
    let mut e = json!({"apiVersion": "v1", "kind": kind, "name": name});
    if let Some(ns) = namespace {
        e["namespace"] = json!(ns);
    }
    e
}

/// XR `name` of OFF's kind in `ns`, composing `refs`.
async fn xr(client: &Client, ns: &str, name: &str, refs: Vec<Value>) -> DynamicObject {
    let mut xr = composite(&OFF.resource(), name, false);
    xr.data["spec"] = json!({"crossplane": {"resourceRefs": refs}});
    Api::namespaced_with(client.clone(), ns, &OFF.resource())
        .create(&PostParams::default(), &xr)
        .await
        .unwrap_or_else(|e| panic!("create XR {ns}/{name}: {e}"))
}

/// Creates a ConfigMap or Secret of each name in `ns`, CREATES_AT_ONCE in
/// flight.
async fn leaves(client: &Client, ns: &str, kind: &str, names: impl IntoIterator<Item = String>) {
    let resource = match kind {
        "Secret" => ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
        _ => config_maps(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let creates = names.into_iter().map(|name| {
        let api = api.clone();
        let resource = resource.clone();
        async move {
            api.create(
                &PostParams::default(),
                &DynamicObject::new(&name, &resource),
            )
            .await
            .unwrap_or_else(|e| panic!("create {kind} {ns}/{name}: {e}"));
        }
    });
    futures::stream::iter(creates)
        .buffer_unordered(CREATES_AT_ONCE)
        .collect::<Vec<()>>()
        .await;
}

/// The API server's count of LIST requests of `resource` (core group) at
/// `scope` (namespace or cluster) answered with `code`.
async fn lists(admin: &Client, resource: &str, scope: &str, code: u16) -> f64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let text = admin
        .request_text(request)
        .await
        .expect("the API server's metrics");
    let labels = [
        format!("code=\"{code}\""),
        "group=\"\"".to_string(),
        format!("resource=\"{resource}\""),
        format!("scope=\"{scope}\""),
        "verb=\"LIST\"".to_string(),
    ];
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The LIST counts this test looks at, of those answered with `code`:
/// ConfigMaps in a namespace and across namespaces, Secrets in a namespace.
async fn list_counts(admin: &Client, code: u16) -> [f64; 3] {
    [
        lists(admin, "configmaps", "namespace", code).await,
        lists(admin, "configmaps", "cluster", code).await,
        lists(admin, "secrets", "namespace", code).await,
    ]
}

/// Which of `before` grew to `after`.
fn grew(before: [f64; 3], after: [f64; 3]) -> [bool; 3] {
    [0, 1, 2].map(|i| after[i] > before[i])
}

async fn read(client: &Client, root: &DynamicObject) -> TreeRead {
    let kinds = ServedKinds::discover(client).await.expect("discovery");
    let listed = Listed::list(client, &kinds).await;
    read_tree(client, &kinds, root, &listed, &Default::default()).await
}

/// `user` may get ConfigMaps anywhere and list them in `ns` only, and get
/// and list the XR kinds; nothing on Secrets.
async fn reader_who_may_not_list_everything(admin: &Client, ns: &str, user: &str) {
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": user},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": [GROUP], "resources": ["*"], "verbs": ["get", "list"]},
        ]
    }))
    .expect("a ClusterRole");
    let binding = |kind: &str| {
        json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
        })
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create the ClusterRole");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding("ClusterRole")).expect("a binding"),
        )
        .await
        .expect("create the ClusterRoleBinding");
    let lister: Role = serde_json::from_value(json!({
        "metadata": {"name": user},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]
    }))
    .expect("a Role");
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &lister)
        .await
        .expect("create the Role");
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding("Role")).expect("a binding"),
        )
        .await
        .expect("create the RoleBinding");
}

/// The tree: root composes ConfigMaps cm-0..19 and Secrets s-0..9 of its
/// namespace (enough of each to be listed), two ConfigMaps never made, five
/// ConfigMaps in each of two other namespaces (a list across namespaces),
/// and XR mid, which composes three ConfigMaps (GETs). Forty other
/// ConfigMaps share the namespace and are not in it.
#[tokio::test]
async fn a_tree_read_by_kind_holds_what_it_composes_whoever_reads_it() {
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "tree-by-kind").await;
    let b = Scope::new(&env.cp, "tree-by-kind-b").await;
    let c = Scope::new(&env.cp, "tree-by-kind-c").await;
    let (admin, ns) = (&s.client, s.namespace.as_str());
    let mut refs: Vec<Value> = names("cm", 20)
        .chain(names("gone", 2))
        .map(|n| entry("ConfigMap", &n, None))
        .collect();
    refs.extend(names("s", 10).map(|n| entry("Secret", &n, None)));
    for other in [&b.namespace, &c.namespace] {
        refs.extend(names("far", 5).map(|n| entry("ConfigMap", &n, Some(other))));
    }
    refs.push(json!({"apiVersion": OFF.resource().api_version, "kind": OFF.kind, "name": "mid"}));
    let root = xr(admin, ns, "root", refs).await;
    xr(
        admin,
        ns,
        "mid",
        names("mid", 3)
            .map(|n| entry("ConfigMap", &n, None))
            .collect(),
    )
    .await;
    leaves(
        admin,
        ns,
        "ConfigMap",
        names("cm", 20).chain(names("mid", 3)),
    )
    .await;
    leaves(admin, ns, "ConfigMap", names("zz-other", 40)).await;
    leaves(admin, ns, "Secret", names("s", 10)).await;
    for other in [&b.namespace, &c.namespace] {
        leaves(admin, other, "ConfigMap", names("far", 5)).await;
    }

    let tree = |secrets_by_name: bool| {
        let mut want = expect([
            (OFF.kind, ns, "root".to_string(), false),
            (OFF.kind, ns, "mid".to_string(), false),
        ]);
        want.extend(expect(
            names("cm", 20)
                .chain(names("mid", 3))
                .map(|n| ("ConfigMap", ns, n, false)),
        ));
        want.extend(expect(
            names("s", 10).map(|n| ("Secret", ns, n, secrets_by_name)),
        ));
        for other in [&b.namespace, &c.namespace] {
            want.extend(expect(
                names("far", 5).map(|n| ("ConfigMap", other.as_str(), n, false)),
            ));
        }
        want
    };
    let listed = list_counts(admin, 200).await;
    let by_admin = read(admin, &root).await;
    assert!(by_admin.unread.is_empty(), "{:?}", by_admin.unread);
    assert_eq!(identities(&by_admin), tree(false), "read by the admin");
    // Read by lists: ConfigMaps in the namespace and across the other two,
    // Secrets (other tests of this binary list too: a count that grew is
    // not proof, one that did not is).
    assert_eq!(grew(listed, list_counts(admin, 200).await), [true; 3]);

    // May list ConfigMaps in the root's namespace only (not across
    // namespaces), nor Secrets, nor read them: the lists refused, GETs read
    // the same tree, the Secrets by name.
    let user = "tree-reader";
    reader_who_may_not_list_everything(admin, ns, user).await;
    let reader = env
        .cp
        .client_as(user, &[])
        .await
        .expect("a client as the reader");
    let listed = list_counts(admin, 200).await;
    let by_reader = read(&reader, &root).await;
    assert!(by_reader.unread.is_empty(), "{:?}", by_reader.unread);
    assert_eq!(identities(&by_reader), tree(true), "read by {user}");
    // Its list in the namespace went through. The API server counts no
    // request its authorization refused, but had a refused list been taken
    // for "none there", the far ConfigMaps and the Secrets would be missing.
    assert!(grew(listed, list_counts(admin, 200).await)[0]);
}

/// A list that brings mostly other objects (200 ConfigMaps sort before the
/// tree's) stops once GETs would cost less, and GETs read the rest.
#[tokio::test]
async fn a_list_that_brings_mostly_others_leaves_the_rest_to_gets() {
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "tree-crowded").await;
    let (admin, ns) = (&s.client, s.namespace.as_str());
    leaves(admin, ns, "ConfigMap", names("aa-other", 200)).await;
    leaves(admin, ns, "ConfigMap", names("cm", 10)).await;
    let refs = names("cm", 10)
        .chain(names("gone", 1))
        .map(|n| entry("ConfigMap", &n, None))
        .collect();
    let root = xr(admin, ns, "root", refs).await;
    let read = read(admin, &root).await;
    assert!(read.unread.is_empty(), "{:?}", read.unread);
    let mut want = expect([(OFF.kind, ns, "root".to_string(), false)]);
    want.extend(expect(names("cm", 10).map(|n| ("ConfigMap", ns, n, false))));
    assert_eq!(identities(&read), want);
}

fn plan(env: &Env, ns: &str, name: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["plan", OFF.plural, name, "-n", ns, "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("run plan");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// A tree of 5,002 objects is cut at 5,000, the root and the first 4,999
/// ConfigMaps it composes, as one GET after another would have cut it;
/// `plan` says so and exits 3, where the same kind's small tree exits 0.
#[tokio::test]
async fn a_tree_past_the_limit_is_cut_in_the_order_read_and_plan_exits_3() {
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "tree-cut").await;
    let (admin, ns) = (&s.client, s.namespace.as_str());
    // Named so that the order composed is not the order listed.
    let name = |i: usize| format!("cm-{}", 5_000 - i);
    leaves(admin, ns, "ConfigMap", (0..5_001).map(name)).await;
    let refs = (0..5_001)
        .map(|i| entry("ConfigMap", &name(i), None))
        .collect();
    let root = xr(admin, ns, "big", refs).await;
    xr(
        admin,
        ns,
        "small",
        (0..3).map(|i| entry("ConfigMap", &name(i), None)).collect(),
    )
    .await;

    let read = read(admin, &root).await;
    assert_eq!(
        read.unread,
        vec!["more than 5000 objects: the rest of the tree was not read".to_string()]
    );
    let mut want = expect([(OFF.kind, ns, "big".to_string(), false)]);
    want.extend(expect(
        (0..4_999).map(|i| ("ConfigMap", ns, name(i), false)),
    ));
    assert_eq!(identities(&read), want);

    let (code, text) = plan(env, ns, "big");
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("more than 5000 objects"), "{text}");
    let (code, text) = plan(env, ns, "small");
    assert_eq!(code, Some(0), "{text}");
}
