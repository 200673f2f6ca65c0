//! Completion driven as TAB drives it. bash sources `cascade-guard
//! completion bash` and calls the function it registers with COMP_WORDS,
//! COMP_CWORD, COMP_LINE and COMP_POINT set, and what it offers (COMPREPLY)
//! is read back; fish sources its script and answers `complete -C LINE`,
//! its own TAB. The binary is first on PATH, as for a user who installed
//! it, so that the scripts can call it back. Included by `#[path]` where
//! used (the completion tests, without and with a cluster).

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `shell`'s script in a file of its own: tests run at once, and one must
/// not read another's half-written script.
fn script_file(shell: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cg-completion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let path = dir.join(format!(
        "cascade-guard-{}.{shell}",
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, script(shell)).expect("write the script");
    path
}

pub fn script(shell: &str) -> String {
    let out = Command::new(crate::binary())
        .args(["completion", shell])
        .output()
        .expect("cascade-guard runs");
    assert!(out.status.success(), "completion {shell} failed");
    String::from_utf8(out.stdout).expect("a UTF-8 script")
}

/// What bash offers on TAB at the end of `line` (a trailing space: a new,
/// empty word), one entry a line, with `env` set (KUBECONFIG, HOME).
pub fn bash(line: &str, env: &[(&str, &Path)]) -> Vec<String> {
    let path = script_file("bash");
    let mut command = Command::new("bash");
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
    command
        .args(["--norc", "--noprofile", "-c", driver, "driver"])
        .arg(&path)
        .arg(line);
    run(command, env)
}

/// What fish offers on TAB at the end of `line`: the candidates of
/// `complete -C`, without their descriptions.
pub fn fish(line: &str, env: &[(&str, &Path)]) -> Vec<String> {
    let path = script_file("fish");
    let mut command = Command::new("fish");
    command
        .args(["--no-config", "-c", "source $argv[1]; complete -C $argv[2]"])
        .arg(&path)
        .arg(line);
    run(command, env)
        .into_iter()
        .map(|l| l.split('\t').next().unwrap_or_default().to_string())
        .collect()
}

/// Runs a shell with the binary first on PATH, `env` set and KUBECONFIG
/// only as `env` gives it; its stdout's lines.
fn run(mut command: Command, env: &[(&str, &Path)]) -> Vec<String> {
    let bin = crate::binary();
    let bin_dir = bin.parent().expect("the binary's directory");
    command
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env_remove("KUBECONFIG");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("the shell runs");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}
