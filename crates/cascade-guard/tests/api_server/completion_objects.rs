//! TAB completes plan's and trace's objects from a real control plane, as a
//! user's bash does after `source <(cascade-guard completion bash)`: the
//! protected kinds first, then the names of a kind's objects in the
//! namespace the line gives (-n), else the kubeconfig context's. The XR
//! kinds' XRDs are the support library's (Refuse, Warn, Convert, Off, ...);
//! no cascade-guard runs. fish, where installed, is driven too (its
//! `complete -C`) and must offer what bash does.

use cascade_guard_testkit as support;

use cascade_guard_testkit::tab;

use local_cluster::skip;

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use support::*;

/// The objects the tests complete: REFUSE kind objects in two namespaces.
const OBJECTS: [(&str, &str); 3] = [("tab-a", "alpha"), ("tab-a", "beta"), ("tab-b", "gamma")];

/// The control plane with the objects in it, and two kubeconfigs for it: its
/// own (context namespace: none, so `default`) and one whose context names
/// tab-b.
async fn cluster() -> (PathBuf, PathBuf) {
    let env = bare_env().await;
    let client = env.cp.admin().await.expect("admin client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for namespace in ["tab-a", "tab-b"] {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        // Tests share the control plane: the first creates.
        let _ = namespaces.create(&PostParams::default(), &ns).await;
    }
    let resource = REFUSE.resource();
    for (namespace, name) in OBJECTS {
        let api = Api::namespaced_with(client.clone(), namespace, &resource);
        let _ = api
            .create(&PostParams::default(), &composite(&resource, name, false))
            .await;
    }
    let kubeconfig = env.cp.dir().join("cascade-guard.kubeconfig");
    let in_tab_b = env.cp.dir().join("tab-b.kubeconfig");
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubeconfig).expect("kubeconfig"))
            .expect("kubeconfig YAML");
    config["contexts"][0]["context"]["namespace"] = "tab-b".into();
    std::fs::write(
        &in_tab_b,
        serde_yaml::to_string(&config).expect("kubeconfig YAML"),
    )
    .expect("write kubeconfig");
    (kubeconfig, in_tab_b)
}

/// What TAB offers at the end of `line`, in bash; fish, where installed,
/// must offer the same.
fn tab(line: &str, kubeconfig: &Path) -> Vec<String> {
    let home = kubeconfig.parent().expect("the kubeconfig's directory");
    let env = [("KUBECONFIG", kubeconfig), ("HOME", home)];
    let mut offered = tab::bash(line, &env);
    offered.sort();
    if fish_installed() {
        let mut fish = tab::fish(line, &env);
        fish.sort();
        assert_eq!(
            fish, offered,
            "fish and bash offer different things for `{line}<TAB>`"
        );
    }
    offered
}

fn fish_installed() -> bool {
    std::process::Command::new("fish")
        .args(["-c", "exit 0"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn fish_is_driven_where_installed() {
    if !fish_installed() {
        skip::skipped("fish is not installed, so only bash's TAB is driven (apt-get install fish)");
    }
}

#[tokio::test]
async fn plan_and_trace_complete_the_protected_kinds() {
    let (kubeconfig, _) = cluster().await;
    for command in ["plan", "trace"] {
        let offered = tab(&format!("cascade-guard {command} "), &kubeconfig);
        for kind in [
            "refusecomposite",
            "warncomposite",
            "convertcomposite",
            "defaultcomposite",
        ] {
            assert!(
                offered.iter().any(|o| o == kind),
                "`{command} <TAB>` offers {offered:?}, not {kind}"
            );
        }
        // Off by its XRD: not protected.
        assert!(!offered.iter().any(|o| o == "offcomposite"), "{offered:?}");
        assert_eq!(
            tab(&format!("cascade-guard {command} refu"), &kubeconfig),
            ["refusecomposite"]
        );
    }
}

#[tokio::test]
async fn plan_and_trace_complete_the_names_in_the_namespace_given() {
    let (kubeconfig, in_tab_b) = cluster().await;
    assert_eq!(
        tab("cascade-guard plan refusecomposite -n tab-a ", &kubeconfig),
        ["alpha", "beta"]
    );
    assert_eq!(
        tab("cascade-guard plan -n tab-a refusecomposite ", &kubeconfig),
        ["alpha", "beta"]
    );
    assert_eq!(
        tab(
            "cascade-guard trace --namespace tab-a refusecomposite/al",
            &kubeconfig
        ),
        ["refusecomposite/alpha"]
    );
    // No -n: the context's namespace (tab-b), then default (none there).
    assert_eq!(
        tab("cascade-guard trace refusecomposites ", &in_tab_b),
        ["gamma"]
    );
    assert_eq!(
        tab("cascade-guard plan refusecomposite ", &kubeconfig),
        Vec::<String>::new()
    );
    // --kubeconfig on the line wins over KUBECONFIG.
    let line = format!(
        "cascade-guard plan --kubeconfig {} refusecomposite ",
        in_tab_b.display()
    );
    assert_eq!(tab(&line, &kubeconfig), ["gamma"]);
    // Flags and their values are still clap's.
    assert!(
        tab("cascade-guard plan refusecomposite alpha -o ", &kubeconfig)
            .contains(&"mermaid".to_string())
    );
}
