//! `source <(cascade-guard completion bash)` as a user's shell runs it: bash
//! itself sources the script and calls its completion function the way it
//! does on TAB (COMP_WORDS, COMP_CWORD, COMP_LINE, COMP_POINT set), and what
//! it offers (COMPREPLY) is checked: flags after a subcommand, and the
//! values of an enum flag. zsh's and fish's scripts are parsed by the
//! shells (`zsh -n`, `fish -n`) where they are installed. No cluster.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use local_cluster::skip;

fn script(shell: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["completion", shell])
        .output()
        .expect("cascade-guard runs");
    assert!(out.status.success(), "completion {shell} failed");
    String::from_utf8(out.stdout).expect("a UTF-8 script")
}

/// What bash offers on TAB at the end of `line` (a trailing space: a new,
/// empty word), one entry a line.
fn bash_completes(line: &str) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("cg-completion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A file per call: tests run at once, and one must not read another's
    // half-written script.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let path = dir.join(format!(
        "cascade-guard-{}.bash",
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, script("bash")).expect("write the script");
    // bash's `complete -F` calls the function with the command, the word
    // being completed and the word before it; COMP_WORDS split as bash
    // splits the line (spaces only here).
    let driver = r#"
source "$1"
line=$2
COMP_LINE=$line
COMP_POINT=${#line}
read -ra COMP_WORDS <<<"$line"
if [[ $line == *" " ]]; then COMP_WORDS+=(""); fi
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
function=$(complete -p cascade-guard | sed -n 's/.*-F \([^ ]*\).*/\1/p')
[[ -n $function ]] || { echo "the script registers no function for cascade-guard" >&2; exit 1; }
"$function" cascade-guard "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", driver, "driver"])
        .arg(&path)
        .arg(line)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
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

#[test]
fn bash_completes_subcommands() {
    assert_eq!(bash_completes("cascade-guard sta"), ["status"]);
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
        let installed = Command::new(shell)
            .args(["-c", "exit 0"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !installed {
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
