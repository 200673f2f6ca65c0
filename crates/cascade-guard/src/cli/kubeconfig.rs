//! Which cluster a command talks to, chosen as kubectl chooses it: the file
//! `--kubeconfig` names, else the files KUBECONFIG lists (merged in order,
//! the first to set a value winning, a file that does not exist passed
//! over), else `~/.kube/config`, else the pod's service account; in it the
//! context `--context` names, else the current one, whose namespace is the
//! default for `-n`.
//!
//! kube-rs's own `Config::infer` stops at the first missing file of a
//! KUBECONFIG list, and its errors come as a chain of four causes; here every
//! way of failing is one line that says what to do, and the binary exits with
//! the code the README gives a cluster it cannot use.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// The `--kubeconfig` and `--context` a command was given.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// Why no client can be configured; each says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "kubeconfig {path} (--kubeconfig) does not exist: give the path of a kubeconfig file, or leave --kubeconfig out to use KUBECONFIG or ~/.kube/config"
    )]
    Missing { path: PathBuf },
    #[error(
        "none of the kubeconfigs KUBECONFIG lists exists ({paths}) and this is not a pod with a service account: set KUBECONFIG to your kubeconfig, or pass --kubeconfig PATH"
    )]
    NoneListed { paths: String },
    #[error(
        "no kubeconfig: KUBECONFIG is not set, {home} does not exist, and this is not a pod with a service account: pass --kubeconfig PATH or set KUBECONFIG"
    )]
    NoneFound { home: String },
    #[error(
        "cannot read kubeconfig {path}: {message}: fix the file, or pass another with --kubeconfig"
    )]
    Unreadable { path: PathBuf, message: String },
    #[error(
        "no context {context:?} in the kubeconfig ({files}); it has: {known}. `kubectl config get-contexts` lists them"
    )]
    NoSuchContext {
        context: String,
        files: String,
        known: String,
    },
    #[error(
        "the kubeconfig ({files}) names no current context: pass --context NAME, or run `kubectl config use-context NAME`"
    )]
    NoCurrentContext { files: String },
    #[error(
        "--context {context} needs a kubeconfig, and there is none (KUBECONFIG is not set, {home} does not exist): pass --kubeconfig PATH or set KUBECONFIG"
    )]
    ContextWithoutKubeconfig { context: String, home: String },
    #[error("cannot use context {context:?} of the kubeconfig ({files}): {message}")]
    Unusable {
        context: String,
        files: String,
        message: String,
    },
}

/// The kubeconfig files a command reads, merged, and which they were (for
/// messages).
#[derive(Debug)]
struct Loaded {
    kubeconfig: Kubeconfig,
    files: Vec<PathBuf>,
}

/// Where kubectl would look, given `--kubeconfig`, KUBECONFIG's value and
/// the home directory (passed in, so that tests need not change the
/// process's environment).
#[derive(Debug)]
enum Source {
    Flag(PathBuf),
    List(Vec<PathBuf>),
    Home(PathBuf),
    Nothing { home: String },
}

fn source(flag: Option<&Path>, kubeconfig_env: Option<&OsStr>, home: Option<&Path>) -> Source {
    if let Some(path) = flag {
        return Source::Flag(path.to_path_buf());
    }
    if let Some(value) = kubeconfig_env {
        // kubectl ignores empty entries (`KUBECONFIG=a::b`, a trailing `:`),
        // and an empty KUBECONFIG altogether.
        let paths: Vec<PathBuf> = std::env::split_paths(value)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if !paths.is_empty() {
            return Source::List(paths);
        }
    }
    match home {
        Some(home) => {
            let path = home.join(".kube").join("config");
            if path.exists() {
                Source::Home(path)
            } else {
                Source::Nothing {
                    home: path.display().to_string(),
                }
            }
        }
        None => Source::Nothing {
            home: "~/.kube/config (HOME is not set)".into(),
        },
    }
}

fn read(path: &Path) -> Result<Kubeconfig, ConfigError> {
    Kubeconfig::read_from(path).map_err(|e| ConfigError::Unreadable {
        path: path.to_path_buf(),
        message: one_line(&e),
    })
}

/// An error and its causes on one line: kube-rs's and YAML's messages may
/// span several.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reads the kubeconfig kubectl would, given `--kubeconfig`, KUBECONFIG and
/// the home directory. `Ok(Err(..))`: there is none (KUBECONFIG lists only
/// files that do not exist, or nothing is set and there is no
/// `~/.kube/config`); the caller tries the pod's service account, and
/// reports that error if it fails too. `Err`: one that is there cannot be
/// used.
fn load_from(
    flag: Option<&Path>,
    kubeconfig_env: Option<&OsStr>,
    home: Option<&Path>,
) -> Result<Result<Loaded, ConfigError>, ConfigError> {
    match source(flag, kubeconfig_env, home) {
        Source::Flag(path) => {
            // kubectl too refuses a --kubeconfig that is not there, rather
            // than talking to some other cluster.
            if !path.exists() {
                return Err(ConfigError::Missing { path });
            }
            let kubeconfig = read(&path)?;
            Ok(Ok(Loaded {
                kubeconfig,
                files: vec![path],
            }))
        }
        Source::List(paths) => {
            let mut merged: Option<Kubeconfig> = None;
            let mut files = Vec::new();
            for path in &paths {
                // As kubectl: a listed file that does not exist is passed
                // over (a KUBECONFIG shared across machines names files that
                // only some have); one that exists must read.
                if !path.exists() {
                    continue;
                }
                let next = read(path)?;
                merged = Some(match merged {
                    None => next,
                    Some(so_far) => so_far.merge(next).map_err(|e| ConfigError::Unreadable {
                        path: path.clone(),
                        message: one_line(&e),
                    })?,
                });
                files.push(path.clone());
            }
            Ok(match merged {
                Some(kubeconfig) => Ok(Loaded { kubeconfig, files }),
                None => Err(ConfigError::NoneListed {
                    paths: join(&paths),
                }),
            })
        }
        Source::Home(path) => {
            let kubeconfig = read(&path)?;
            Ok(Ok(Loaded {
                kubeconfig,
                files: vec![path],
            }))
        }
        Source::Nothing { home } => Ok(Err(ConfigError::NoneFound { home })),
    }
}

fn join(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The client configuration for `selection`, with the environment's
/// KUBECONFIG and HOME; its `default_namespace` is the chosen context's.
pub async fn config(selection: &Selection) -> Result<kube::Config, ConfigError> {
    let kubeconfig_env = std::env::var_os("KUBECONFIG");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut config = config_from(selection, kubeconfig_env.as_deref(), home.as_deref()).await?;
    // kube-rs's KUBE_RS_DEBUG_* variables (impersonation, another URL), as
    // Config::infer, which this replaces, applied them.
    config.apply_debug_overrides();
    Ok(config)
}

async fn config_from(
    selection: &Selection,
    kubeconfig_env: Option<&OsStr>,
    home: Option<&Path>,
) -> Result<kube::Config, ConfigError> {
    match load_from(selection.kubeconfig.as_deref(), kubeconfig_env, home)? {
        Ok(loaded) => from_loaded(loaded, selection.context.as_deref()).await,
        // No kubeconfig: the controller in its pod, as kubectl in one.
        Err(none) => match (&selection.context, &none) {
            (Some(context), ConfigError::NoneFound { home }) => {
                Err(ConfigError::ContextWithoutKubeconfig {
                    context: context.clone(),
                    home: home.clone(),
                })
            }
            _ => kube::Config::incluster().map_err(|_| none),
        },
    }
}

/// The chosen context's configuration. The context is checked here, not by
/// kube-rs, so that a wrong name lists the right ones.
async fn from_loaded(loaded: Loaded, context: Option<&str>) -> Result<kube::Config, ConfigError> {
    let files = join(&loaded.files);
    let chosen = match context {
        Some(name) => name.to_string(),
        None => match &loaded.kubeconfig.current_context {
            Some(name) if !name.is_empty() => name.clone(),
            _ => return Err(ConfigError::NoCurrentContext { files }),
        },
    };
    if !loaded.kubeconfig.contexts.iter().any(|c| c.name == chosen) {
        let known: Vec<&str> = loaded
            .kubeconfig
            .contexts
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        return Err(ConfigError::NoSuchContext {
            context: chosen,
            files,
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        });
    }
    let options = KubeConfigOptions {
        context: Some(chosen.clone()),
        ..KubeConfigOptions::default()
    };
    kube::Config::from_custom_kubeconfig(loaded.kubeconfig, &options)
        .await
        .map_err(|e| ConfigError::Unusable {
            context: chosen,
            files,
            message: one_line(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory for one test's files.
    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cg-kubeconfig-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// A kubeconfig with one context per (name, server, namespace), the
    /// first current unless `current` says otherwise.
    fn kubeconfig(contexts: &[(&str, &str, Option<&str>)], current: Option<&str>) -> String {
        let mut text = String::from("apiVersion: v1\nkind: Config\n");
        if let Some(current) = current.or(contexts.first().map(|c| c.0)) {
            text.push_str(&format!("current-context: {current}\n"));
        }
        text.push_str("clusters:\n");
        for (name, server, _) in contexts {
            text.push_str(&format!(
                "- name: {name}\n  cluster:\n    server: {server}\n"
            ));
        }
        text.push_str("users:\n");
        for (name, _, _) in contexts {
            text.push_str(&format!("- name: {name}\n  user:\n    token: t-{name}\n"));
        }
        text.push_str("contexts:\n");
        for (name, _, namespace) in contexts {
            text.push_str(&format!(
                "- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n"
            ));
            if let Some(ns) = namespace {
                text.push_str(&format!("    namespace: {ns}\n"));
            }
        }
        text
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    fn list(paths: &[&Path]) -> std::ffi::OsString {
        std::env::join_paths(paths).expect("paths without a separator")
    }

    fn selection(context: Option<&str>) -> Selection {
        Selection {
            kubeconfig: None,
            context: context.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_list_skips_missing_files_and_the_first_to_set_a_value_wins() {
        let d = dir("list");
        let missing = d.join("missing");
        let a = write(
            &d,
            "a",
            &kubeconfig(&[("a", "https://a.example:6443", Some("team-a"))], None),
        );
        let b = write(
            &d,
            "b",
            &kubeconfig(
                &[
                    ("b", "https://b.example:6443", None),
                    // Also in a: a's wins.
                    ("a", "https://not-a.example:6443", Some("not-a")),
                ],
                None,
            ),
        );
        let env = list(&[&missing, &a, &missing, &b]);
        let config = config_from(&selection(None), Some(&env), None)
            .await
            .expect("the missing entries are passed over");
        assert_eq!(config.cluster_url.to_string(), "https://a.example:6443/");
        assert_eq!(config.default_namespace, "team-a");

        let config = config_from(&selection(Some("b")), Some(&env), None)
            .await
            .expect("b's context, from the second file");
        assert_eq!(config.cluster_url.to_string(), "https://b.example:6443/");
        // A context without a namespace: kubectl's default.
        assert_eq!(config.default_namespace, "default");
    }

    #[tokio::test]
    async fn context_picks_the_cluster_and_the_namespace() {
        let d = dir("context");
        let path = write(
            &d,
            "config",
            &kubeconfig(
                &[
                    ("dev", "https://dev.example:6443", Some("dev-ns")),
                    ("prod", "https://prod.example:6443", Some("prod-ns")),
                ],
                Some("dev"),
            ),
        );
        let chosen = |context: Option<&str>| Selection {
            kubeconfig: Some(path.clone()),
            context: context.map(str::to_string),
        };
        // --kubeconfig wins over KUBECONFIG, as in kubectl.
        let elsewhere = list(&[&d.join("nothing-here")]);
        let config = config_from(&chosen(None), Some(&elsewhere), None)
            .await
            .expect("current context");
        assert_eq!(config.cluster_url.to_string(), "https://dev.example:6443/");
        assert_eq!(config.default_namespace, "dev-ns");
        let config = config_from(&chosen(Some("prod")), None, None)
            .await
            .expect("--context prod");
        assert_eq!(config.cluster_url.to_string(), "https://prod.example:6443/");
        assert_eq!(config.default_namespace, "prod-ns");

        let err = config_from(&chosen(Some("staging")), None, None)
            .await
            .expect_err("no such context");
        let said = err.to_string();
        assert!(
            matches!(err, ConfigError::NoSuchContext { .. }) && said.contains("dev, prod"),
            "{said}"
        );
    }

    #[tokio::test]
    async fn home_kubeconfig_is_read_when_nothing_else_is_given() {
        let d = dir("home");
        std::fs::create_dir_all(d.join(".kube")).expect("~/.kube");
        write(
            &d.join(".kube"),
            "config",
            &kubeconfig(&[("home", "https://home.example:6443", None)], None),
        );
        // An empty KUBECONFIG is as good as none.
        let config = config_from(&selection(None), Some(OsStr::new("")), Some(&d))
            .await
            .expect("~/.kube/config");
        assert_eq!(config.cluster_url.to_string(), "https://home.example:6443/");
    }

    #[tokio::test]
    async fn what_cannot_be_found_or_read_says_what_to_do_in_one_line() {
        let d = dir("missing");
        let missing = d.join("missing");
        let flag = Selection {
            kubeconfig: Some(missing.clone()),
            context: None,
        };
        let mut said = Vec::new();
        let err = config_from(&flag, None, None).await.expect_err("missing");
        assert!(matches!(err, ConfigError::Missing { .. }), "{err}");
        said.push(err);

        // Outside a pod, so the service account is no way out either.
        let env = list(&[&missing, &d.join("also-missing")]);
        let err = config_from(&selection(None), Some(&env), Some(&d))
            .await
            .expect_err("nothing listed exists");
        assert!(matches!(err, ConfigError::NoneListed { .. }), "{err}");
        said.push(err);

        let err = config_from(&selection(None), None, Some(&d))
            .await
            .expect_err("no ~/.kube/config");
        assert!(matches!(err, ConfigError::NoneFound { .. }), "{err}");
        said.push(err);

        let err = config_from(&selection(Some("prod")), None, Some(&d))
            .await
            .expect_err("a context needs a kubeconfig");
        assert!(
            matches!(err, ConfigError::ContextWithoutKubeconfig { .. }),
            "{err}"
        );
        said.push(err);

        let broken = write(&d, "broken", "clusters: [unclosed\n  - :\n");
        let err = config_from(&selection(None), Some(&list(&[&broken])), None)
            .await
            .expect_err("not YAML");
        assert!(matches!(err, ConfigError::Unreadable { .. }), "{err}");
        said.push(err);

        let no_current = write(
            &d,
            "no-current",
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
        );
        let err = config_from(&selection(None), Some(&list(&[&no_current])), None)
            .await
            .expect_err("no current context");
        assert!(matches!(err, ConfigError::NoCurrentContext { .. }), "{err}");

        said.push(err);
        // The binary prints each as it is: one line, never a chain.
        for err in said {
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
}
