//! `cascade-guard completion SHELL`: clap_complete's scripts, with its bash
//! script repaired for a binary whose name has a hyphen, and completing
//! `plan` and `trace`'s objects from the cluster ([`objects`]).
//!
//! clap_complete 4.6 names the bash function's states two ways: where it
//! sets `cmd` it turns the binary name's `-` into `__`
//! (`cascade__guard__subcmd__status`), where it matches `cmd` into
//! `__subcmd__` (`cascade__subcmd__guard__subcmd__status`). No state
//! matches, so bash completed the subcommands and nothing after them: no
//! flag, no value. The matches are renamed to the names that are set.

pub mod objects;

use clap_complete::Shell;

/// The hidden command the bash script calls for `plan` and `trace`'s
/// objects ([`objects::run`]).
pub const OBJECTS_COMMAND: &str = "__complete";

/// The completion script for `shell`, for the command `bin`.
pub fn script(shell: Shell, command: &clap::Command, bin: &str) -> String {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut shown(command), bin, &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        Shell::Bash => with_objects(&repair_bash(&script, bin), bin),
        Shell::Fish => fish_with_objects(&script, bin),
        _ => script,
    }
}

/// `command` without its hidden subcommands and arguments, which
/// clap_complete's scripts would offer (`__complete`, the old names of the
/// time flags).
fn shown(command: &clap::Command) -> clap::Command {
    let mut shown = clap::Command::new(command.get_name().to_string())
        .args(
            command
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .cloned(),
        )
        .subcommands(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(shown),
        );
    if let Some(about) = command.get_about() {
        shown = shown.about(about.clone());
    }
    if let Some(version) = command.get_version() {
        shown = shown.version(version.to_string());
    }
    shown
}

/// The bash script, with a function in front of clap_complete's: at `plan`
/// and `trace`'s object it offers what [`OBJECTS_COMMAND`] prints (nothing,
/// not file names, when the cluster offers nothing); anywhere else it is
/// clap_complete's, which it registers in its place.
fn with_objects(script: &str, bin: &str) -> String {
    // clap_complete's registration: `complete -F FUNCTION ... bin`.
    let Some(clap_function) = script.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("complete -F ")?;
        line.trim_end()
            .ends_with(&format!(" {bin}"))
            .then(|| rest.split_whitespace().next())?
    }) else {
        return script.to_string();
    };
    let function = format!("_{}_objects", bin.replace('-', "_"));
    let hook = format!(
        r#"
# plan and trace's objects from the cluster; clap_complete's function elsewhere.
{function}() {{
    local objects
    case "${{COMP_WORDS[1]}}" in
        plan|trace)
            if objects=$("${{COMP_WORDS[0]}}" {OBJECTS_COMMAND} "${{COMP_WORDS[@]:1:COMP_CWORD}}" 2>/dev/null); then
                compopt +o default +o bashdefault 2>/dev/null
                COMPREPLY=($(compgen -W "${{objects}}" -- "${{COMP_WORDS[COMP_CWORD]}}"))
                return 0
            fi
            ;;
    esac
    {clap_function} "$@"
}}
if [[ "${{BASH_VERSINFO[0]}}" -eq 4 && "${{BASH_VERSINFO[1]}}" -ge 4 || "${{BASH_VERSINFO[0]}}" -gt 4 ]]; then
    complete -F {function} -o nosort -o bashdefault -o default {bin}
else
    complete -F {function} -o bashdefault -o default {bin}
fi
"#
    );
    format!("{script}{hook}")
}

/// Renames the states the bash script matches (`a__subcmd__b__subcmd__x)`)
/// to those it sets (`a__b__subcmd__x`): only the binary's own name is
/// spelled differently, so only that prefix changes.
fn repair_bash(script: &str, bin: &str) -> String {
    let set = bin.replace('-', "__");
    let matched = bin.replace('-', "__subcmd__");
    if set == matched {
        return script.to_string();
    }
    script
        .lines()
        .map(|line| {
            let label = line.trim_start();
            // Only the case labels of the state machine: `NAME__subcmd__...)`.
            if label.starts_with(&format!("{matched}__subcmd__")) && label.ends_with(')') {
                line.replacen(&matched, &set, 1)
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The fish script, completing plan and trace's objects with what
/// [`OBJECTS_COMMAND`] prints; where it prints nothing (at a flag, or no
/// cluster), clap_complete's rules alone complete.
fn fish_with_objects(script: &str, bin: &str) -> String {
    let function = format!("__fish_{}_objects", bin.replace('-', "_"));
    let using = format!("__fish_{}_using_subcommand", bin.replace('-', "_"));
    format!(
        r#"{script}
# plan and trace's objects from the cluster.
function {function}
    set -l words (commandline -opc)
    {bin} {OBJECTS_COMMAND} $words[2..-1] (commandline -ct) 2>/dev/null
end
complete -c {bin} -n "{using} plan; or {using} trace" -f -a "({function})"
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        clap::Command::new("my-tool")
            .subcommand(clap::Command::new("status").arg(clap::Arg::new("output").long("output")))
    }

    /// Every state the bash script matches is one it sets: the bug, caught
    /// without a shell (tests/without_cluster/completion.rs drives bash).
    #[test]
    fn every_bash_state_matched_is_one_that_is_set() {
        let script = script(Shell::Bash, &command(), "my-tool");
        let set: Vec<&str> = script
            .lines()
            .filter_map(|l| l.trim().strip_prefix("cmd=\"")?.strip_suffix('"'))
            .collect();
        let matched: Vec<&str> = script
            .lines()
            .map(str::trim)
            // The states of `case "${cmd}"`, not the `"${cmd},${word}"`
            // steps that lead to them.
            .filter(|l| l.starts_with("my__") && l.ends_with(')') && !l.contains(','))
            .filter_map(|l| l.strip_suffix(')'))
            .collect();
        assert!(matched.contains(&"my__tool__subcmd__status"), "{script}");
        for state in &matched {
            assert!(set.contains(state), "{state} is matched but never set");
        }
    }

    #[test]
    fn a_name_without_a_hyphen_is_left_alone() {
        let mut unrepaired = Vec::new();
        clap_complete::generate(
            Shell::Bash,
            &mut command().name("tool"),
            "tool",
            &mut unrepaired,
        );
        let unrepaired = String::from_utf8_lossy(&unrepaired);
        assert_eq!(repair_bash(&unrepaired, "tool"), unrepaired);
    }

    /// The function bash calls first is the one that asks for objects, and
    /// it hands everything else to clap_complete's (driven by bash in
    /// tests/without_cluster/completion.rs and, with a cluster,
    /// tests/api_server/completion_objects.rs).
    #[test]
    fn bash_asks_for_objects_first_and_else_calls_clap_completes_function() {
        let script = script(Shell::Bash, &command(), "my-tool");
        let registered: Vec<&str> = script
            .lines()
            .filter_map(|l| l.trim().strip_prefix("complete -F "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(
            registered.last(),
            Some(&"_my_tool_objects"),
            "{registered:?}"
        );
        assert!(script.contains(&format!(
            "{OBJECTS_COMMAND} \"${{COMP_WORDS[@]:1:COMP_CWORD}}\""
        )));
        assert!(script.contains("    _my__tool \"$@\"\n"), "{script}");
    }
}
