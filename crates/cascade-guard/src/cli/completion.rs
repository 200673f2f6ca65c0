//! `cascade-guard completion SHELL`: clap_complete's scripts, with its bash
//! script repaired for a binary whose name has a hyphen.
//!
//! clap_complete 4.6 names the bash function's states two ways: where it
//! sets `cmd` it turns the binary name's `-` into `__`
//! (`cascade__guard__subcmd__status`), where it matches `cmd` into
//! `__subcmd__` (`cascade__subcmd__guard__subcmd__status`). No state
//! matches, so bash completed the subcommands and nothing after them: no
//! flag, no value. The matches are renamed to the names that are set.

use clap_complete::Shell;

/// The completion script for `shell`, for the command `bin`.
pub fn script(shell: Shell, command: &mut clap::Command, bin: &str) -> String {
    let mut script = Vec::new();
    clap_complete::generate(shell, command, bin, &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        Shell::Bash => repair_bash(&script, bin),
        _ => script,
    }
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
        let script = script(Shell::Bash, &mut command(), "my-tool");
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
        let mut plain = command().name("tool");
        let mut unrepaired = Vec::new();
        clap_complete::generate(Shell::Bash, &mut plain.clone(), "tool", &mut unrepaired);
        assert_eq!(
            script(Shell::Bash, &mut plain, "tool"),
            String::from_utf8_lossy(&unrepaired)
        );
    }
}
