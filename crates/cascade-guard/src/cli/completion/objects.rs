//! What TAB offers for `plan` and `trace`'s object: the protected kinds, then
//! the names of that kind's objects, read from the cluster the command line
//! names (its --kubeconfig, --context and -n, else the current context), as
//! kubectl completes `kubectl get TYPE <TAB>`. The bash and fish scripts call
//! the hidden `cascade-guard __complete WORDS...` on TAB; a cluster that does not
//! answer in [`PATIENCE`] gets nothing offered, quietly.
//!
//! clap_complete's dynamic completion (`unstable-dynamic`) was the other
//! way; its completers see only the word under the cursor, not the kind
//! typed before it or the -n and --context given, and it replaces the
//! tested static scripts with an unstable protocol.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use kube::api::ListParams;

use crate::cli::exit::Outcome;
use crate::cli::kubeconfig::{self, Selection};
use crate::cluster::inputs::read_once;
use crate::cluster::kinds::ServedKinds;
use crate::policy::{Mode, resolve};

/// How long TAB waits for the cluster before offering nothing.
pub const PATIENCE: Duration = Duration::from_millis(1500);

/// Where the cursor is on a `plan` or `trace` command line.
#[derive(Debug, Default, PartialEq)]
pub struct Position {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
    /// What to complete.
    pub wanted: Wanted,
    /// The word under the cursor, as typed so far.
    pub current: String,
}

#[derive(Debug, Default, PartialEq)]
pub enum Wanted {
    /// The resource: a protected kind.
    #[default]
    Kind,
    /// A name of this resource's objects, offered after `prefix`
    /// (`inferencecluster/` when typed as TYPE/NAME).
    Name { resource: String, prefix: String },
}

/// The cursor's position in `words` (the command line after the binary's
/// name, the last word the one under the cursor), when it is at `plan`'s or
/// `trace`'s object; None at a flag or its value, which clap's script
/// completes. `takes_value` says which flags take a value (`-n`, `-o`, ...).
pub fn position(words: &[String], takes_value: impl Fn(&str) -> bool) -> Option<Position> {
    let (current, before) = words.split_last()?;
    let (command, flags) = before.split_first()?;
    if !matches!(command.as_str(), "plan" | "trace") || current.starts_with('-') {
        return None;
    }
    let mut position = Position {
        current: current.clone(),
        ..Position::default()
    };
    let mut positionals = Vec::new();
    let mut words = flags.iter().map(String::as_str).peekable();
    while let Some(word) = words.next() {
        if !word.starts_with('-') || word == "-" {
            positionals.push(word);
            continue;
        }
        if word == "--" {
            positionals.extend(words.by_ref());
            break;
        }
        let (flag, value) = match word.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_string())),
            None if takes_value(word) => {
                // bash splits `--context=prod` at the `=` into three words.
                if words.peek() == Some(&"=") {
                    words.next();
                }
                match words.next() {
                    Some(value) => (word, Some(value.to_string())),
                    // The cursor is at this flag's value.
                    None => return None,
                }
            }
            None => (word, None),
        };
        match (flag, value) {
            ("--kubeconfig", Some(v)) => position.kubeconfig = Some(PathBuf::from(v)),
            ("--context", Some(v)) => position.context = Some(v),
            ("-n" | "--namespace", Some(v)) => position.namespace = Some(v),
            _ => {}
        }
    }
    position.wanted = match (positionals.as_slice(), current.split_once('/')) {
        ([], None) => Wanted::Kind,
        ([], Some((resource, _))) => Wanted::Name {
            resource: resource.to_string(),
            prefix: format!("{resource}/"),
        },
        ([resource], None) if !resource.contains('/') => Wanted::Name {
            resource: resource.to_string(),
            prefix: String::new(),
        },
        _ => return None,
    };
    Some(position)
}

/// `cascade-guard __complete WORDS...`: the candidates, one a line, and 0
/// at an object (even when the cluster offers none: bash then offers
/// nothing, not file names); 1 elsewhere, for clap's script to complete.
pub async fn run(words: &[String], command: &clap::Command) -> Outcome {
    let takes_value = |flag: &str| {
        let Some(sub) = words.first().and_then(|c| command.find_subcommand(c)) else {
            return false;
        };
        sub.get_arguments().any(|arg| {
            let named = match flag.strip_prefix("--") {
                Some(long) => arg.get_long() == Some(long),
                None => flag.strip_prefix('-').is_some_and(|s| {
                    s.chars().count() == 1
                        && arg.get_short().map(String::from).as_deref() == Some(s)
                }),
            };
            named && arg.get_action().takes_values()
        })
    };
    let Some(position) = position(words, takes_value) else {
        return Ok(1);
    };
    // Anything the cluster does not answer (no kubeconfig, no server, no
    // permission, too slow) offers nothing: TAB must not print errors.
    let offered = tokio::time::timeout(PATIENCE, candidates(&position))
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let lines: String = offered
        .into_iter()
        .filter(|c| c.starts_with(&position.current))
        .map(|c| c + "\n")
        .collect();
    crate::cli::exit::out(&lines)?;
    Ok(0)
}

async fn candidates(position: &Position) -> Option<Vec<String>> {
    let selection = Selection {
        kubeconfig: position.kubeconfig.clone(),
        context: position.context.clone(),
    };
    let config = kubeconfig::config(&selection).await.ok()?;
    let namespace = position
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).ok()?;
    match &position.wanted {
        Wanted::Kind => {
            let read = read_once(&client, Mode::Refuse).await.ok()?;
            Some(kind_names(&resolve(&read.inputs).policies))
        }
        Wanted::Name { resource, prefix } => {
            let kinds = ServedKinds::discover(&client).await.ok()?;
            let served = kinds.lookup(&client, resource).await?;
            let api = ServedKinds::api(&client, served, Some(&namespace));
            let list = api.list_metadata(&ListParams::default()).await.ok()?;
            Some(
                list.items
                    .into_iter()
                    .filter_map(|o| o.metadata.name)
                    .map(|name| format!("{prefix}{name}"))
                    .collect(),
            )
        }
    }
}

/// The protected kinds as people type them: `inferencecluster`, or
/// `inferencecluster.modelplane.ai` where two groups have the kind.
fn kind_names(policies: &[crate::policy::Policy]) -> Vec<String> {
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for policy in policies.iter().filter(|p| p.mode != Mode::Off) {
        let groups = groups.entry(policy.kind.kind.to_lowercase()).or_default();
        if !groups.contains(&policy.kind.group.as_str()) {
            groups.push(&policy.kind.group);
        }
    }
    groups
        .into_iter()
        .flat_map(|(kind, in_groups)| match in_groups.as_slice() {
            [_] => vec![kind],
            several => several.iter().map(|g| format!("{kind}.{g}")).collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: &str) -> Option<Position> {
        let mut words: Vec<String> = line.split(' ').map(str::to_string).collect();
        words.remove(0);
        position(&words, |flag| {
            matches!(
                flag,
                "-n" | "--namespace" | "--kubeconfig" | "--context" | "-o" | "--output" | "--mode"
            )
        })
    }

    fn name(resource: &str, prefix: &str) -> Wanted {
        Wanted::Name {
            resource: resource.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn the_cursor_is_at_the_kind_then_the_name() {
        let wanted = |line: &str| at(line).map(|p| p.wanted);
        assert_eq!(wanted("cascade-guard plan "), Some(Wanted::Kind));
        assert_eq!(wanted("cascade-guard trace infer"), Some(Wanted::Kind));
        assert_eq!(
            wanted("cascade-guard plan inferencecluster "),
            Some(name("inferencecluster", ""))
        );
        assert_eq!(
            wanted("cascade-guard plan -o json inferencecluster pr"),
            Some(name("inferencecluster", ""))
        );
        assert_eq!(
            wanted("cascade-guard trace inferencecluster/pr"),
            Some(name("inferencecluster", "inferencecluster/"))
        );
        // Not an object: a flag, a flag's value, a third word, another command.
        for line in [
            "cascade-guard plan --",
            "cascade-guard plan x -o ",
            "cascade-guard plan x --context = ",
            "cascade-guard plan x y ",
            "cascade-guard plan x/y ",
            "cascade-guard status ",
            "cascade-guard ",
        ] {
            assert_eq!(wanted(line), None, "{line}");
        }
    }

    #[test]
    fn the_cluster_and_namespace_come_from_the_line() {
        let p = at("cascade-guard plan --kubeconfig /k --context = prod -n team-a x ")
            .expect("at a name");
        assert_eq!(p.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(p.context.as_deref(), Some("prod"));
        assert_eq!(p.namespace.as_deref(), Some("team-a"));
        assert_eq!(p.wanted, name("x", ""));
        let p = at("cascade-guard trace --namespace=ops x l").expect("at a name");
        assert_eq!(p.namespace.as_deref(), Some("ops"));
        assert_eq!(p.current, "l");
    }
}
