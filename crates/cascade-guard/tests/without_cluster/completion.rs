//! `source <(cascade-guard completion bash)` as a user's shell runs it: bash
//! itself sources the script and calls its completion function the way it
//! does on TAB (COMP_WORDS, COMP_CWORD, COMP_LINE, COMP_POINT set), and what
//! it offers (COMPREPLY) is checked: flags after a subcommand, and the
//! values of an enum flag, and nothing for plan's and trace's objects when no
//! cluster answers (tests/api_server/completion_objects.rs has one that
//! does). zsh's and fish's scripts are parsed by the
//! shells (`zsh -n`, `fish -n`) where they are installed. No cluster.

use std::path::PathBuf;
use std::process::Command;

use local_cluster::skip;

use cascade_guard_testkit::tab;

use cascade_guard_testkit::no_cluster;

use tab::script;

/// A HOME without a kubeconfig, and a KUBECONFIG naming a cluster on a port
/// nothing listens on: what TAB offers when no cluster answers.
fn no_cluster() -> (PathBuf, PathBuf) {
    let home = std::env::temp_dir().join(format!("cg-completion-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).expect("home");
    let kubeconfig = no_cluster::kubeconfig(&home);
    (home, kubeconfig)
}

fn bash_completes(line: &str) -> Vec<String> {
    let (home, kubeconfig) = no_cluster();
    tab::bash(line, &[("HOME", &home), ("KUBECONFIG", &kubeconfig)])
}

fn assert_offers(line: &str, want: &[&str]) {
    let offered = bash_completes(line);
    for value in want {
        assert!(
            offered.iter().any(|o| o == value),
            "`{line}<TAB>` offers {offered:?}, not {value}"
        );
    }
}

#[test]
fn bash_completes_the_flags_after_a_subcommand() {
    assert_offers(
        "cascade-guard status --",
        &[
            "--kubeconfig",
            "--context",
            "--output",
            "--leader-election-id",
            "--use-flags",
        ],
    );
    assert_offers(
        "cascade-guard plan --",
        &["--namespace", "--mode", "--output", "--context"],
    );
    // Only status's: no flag of another command.
    let offered = bash_completes("cascade-guard status --");
    assert!(!offered.iter().any(|o| o == "--mode"), "{offered:?}");
}

#[test]
fn bash_completes_the_values_of_enum_flags() {
    let formats = ["text", "json", "yaml", "dot", "mermaid"];
    assert_offers("cascade-guard plan x y -o ", &formats);
    assert_offers("cascade-guard plan x y --output ", &formats);
    assert_offers(
        "cascade-guard plan x y --mode ",
        &["Refuse", "Convert", "Warn", "Off"],
    );
    assert_offers(
        "cascade-guard status --xrd-default-mode ",
        &["Refuse", "Convert", "Warn", "Off"],
    );
    assert_offers("cascade-guard trace x -o ", &["text", "json", "yaml"]);
    assert_offers("cascade-guard plan x y -o j", &["json"]);
    assert_eq!(bash_completes("cascade-guard plan x y -o j"), ["json"]);
}

/// plan's and trace's objects come from the cluster; with none answering,
/// TAB offers nothing there (not the flags, not file names), and still
/// completes flags and their values around them.
#[test]
fn bash_offers_no_objects_when_no_cluster_answers() {
    // A file that `-o default` would offer, were it left on.
    let (home, _) = no_cluster();
    std::fs::write(home.join("inferencecluster.yaml"), "").expect("file");
    for line in [
        "cascade-guard plan ",
        "cascade-guard trace inferencecluster ",
        "cascade-guard plan inferencecluster/",
        "cascade-guard plan -n team-a ",
    ] {
        assert_eq!(bash_completes(line), Vec::<String>::new(), "`{line}<TAB>`");
    }
    // fish too, where installed (its own TAB: `complete -C`).
    let (home, kubeconfig) = no_cluster();
    if installed("fish") {
        let env = [
            ("HOME", home.as_path()),
            ("KUBECONFIG", kubeconfig.as_path()),
        ];
        assert_eq!(tab::fish("cascade-guard plan ", &env), Vec::<String>::new());
        assert!(tab::fish("cascade-guard plan x -o ", &env).contains(&"json".to_string()));
    } else {
        skip::skipped("fish is not installed, so only bash's TAB is driven (apt-get install fish)");
    }
    assert_offers("cascade-guard plan x --", &["--namespace", "--mode"]);
    assert_offers("cascade-guard trace x -o ", &["json"]);
}

#[test]
fn bash_completes_subcommands() {
    assert_eq!(bash_completes("cascade-guard sta"), ["status"]);
}

/// What is hidden from --help is not offered either: the command the bash
/// script calls back, and the old names of the time flags.
#[test]
fn hidden_commands_and_flags_are_not_offered() {
    let commands = bash_completes("cascade-guard ");
    assert!(commands.iter().any(|c| c == "plan"), "{commands:?}");
    assert!(
        !commands.iter().any(|c| c.starts_with("__")),
        "{commands:?}"
    );
    let flags = bash_completes("cascade-guard run --");
    assert!(flags.iter().any(|f| f == "--resync"), "{flags:?}");
    assert!(!flags.iter().any(|f| f == "--resync-seconds"), "{flags:?}");
    assert!(
        !bash_completes("cascade-guard trace x --")
            .iter()
            .any(|f| f == "--interval-ms")
    );
    for shell in ["zsh", "fish"] {
        let text = script(shell);
        for hidden in ["resync-seconds", "interval-ms"] {
            assert!(!text.contains(hidden), "{shell}'s script offers {hidden}");
        }
        // fish's script calls it for objects; neither offers it.
        for offer in ["-a \"__complete\"", "'__complete:"] {
            assert!(!text.contains(offer), "{shell}'s script offers __complete");
        }
    }
}

/// zsh and fish are not on every machine: each parses its script where it
/// is installed, and says it skipped where it is not.
#[test]
fn zsh_and_fish_parse_their_scripts() {
    // What each offers for `plan --mode`: the modes, where clap_complete
    // wrote file names when the flag had no values.
    for (shell, check, modes) in [
        ("zsh", ["-n"], ":MODE:(Refuse Convert Warn Off)"),
        ("fish", ["--no-execute"], "-l mode -d"),
    ] {
        if !installed(shell) {
            skip::skipped(&format!(
                "{shell} is not installed, so its completion script is not parsed (apt-get install {shell})"
            ));
            continue;
        }
        let dir = std::env::temp_dir().join(format!("cg-completion-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(format!("cascade-guard.{shell}"));
        let text = script(shell);
        assert!(text.contains(modes), "{shell}: --mode offers no modes");
        if shell == "fish" {
            let mode = text
                .lines()
                .find(|l| l.contains("subcommand plan") && l.contains("-l mode "))
                .expect("fish: plan --mode");
            assert!(
                mode.contains("-f -a \"Refuse"),
                "fish: --mode offers files: {mode}"
            );
        }
        std::fs::write(&path, text).expect("write the script");
        let out = Command::new(shell)
            .args(check)
            .arg(&path)
            .output()
            .expect("the shell runs");
        assert!(
            out.status.success(),
            "{shell} cannot parse its script: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn installed(shell: &str) -> bool {
    Command::new(shell)
        .args(["-c", "exit 0"])
        .output()
        .is_ok_and(|o| o.status.success())
}
