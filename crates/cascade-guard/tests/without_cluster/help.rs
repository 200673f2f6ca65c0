//! `--help` as people read it, from the binary: every command has an
//! Examples section and says what every argument is, the help fits the
//! terminal it is wrapped to, the examples that need no cluster run as
//! written, and the exit codes it lists are the ones the command returns.
//! No cluster: where a command must fail to reach one, it is given a
//! kubeconfig naming a closed port on loopback.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cascade_guard::cli::args::Cli;
use clap::CommandFactory;

use local_cluster::skip;

use cascade_guard_testkit::no_cluster;

const BIN: &str = env!("CARGO_BIN_EXE_cascade-guard");

/// Every command path: `[]` for the top level, `["plan"]`, ...
fn commands() -> Vec<Vec<String>> {
    let mut all = vec![Vec::new()];
    for sub in Cli::command().get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            all.push(vec![sub.get_name().to_string()]);
        }
    }
    all
}

fn run_help(path: &[String], flag: &str, columns: &str) -> String {
    let out = Command::new(BIN)
        .args(path)
        .arg(flag)
        .env("COLUMNS", columns)
        .output()
        .expect("cascade-guard runs");
    assert!(out.status.success(), "{path:?} {flag} failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The lines of the section headed `title` (up to the next heading).
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .collect()
}

#[test]
fn every_command_has_examples_and_every_argument_a_description() {
    for path in commands() {
        for flag in ["-h", "--help"] {
            let help = run_help(&path, flag, "100");
            let examples = section(&help, "Examples:");
            assert!(
                examples
                    .iter()
                    .any(|l| l.trim_start().starts_with("cascade-guard")),
                "cascade-guard {} {flag}: no Examples section with a command in it:\n{help}",
                path.join(" ")
            );
        }
    }
    fn walk(command: &clap::Command, path: &str) {
        if !command.is_hide_set() {
            let about = command
                .get_about()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(
                !about.trim().is_empty(),
                "{path}: a command that does not say what it does"
            );
        }
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert!(
                !help.trim().is_empty(),
                "{path} {}: an argument without a description",
                arg.get_id()
            );
        }
        for sub in command.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()));
        }
    }
    walk(&Cli::command(), "cascade-guard");
}

/// A flag with a fixed set of values lists them (`--mode` once offered
/// none), and every time flag takes a duration.
#[test]
fn flags_say_their_values() {
    let plan = run_help(&["plan".into()], "--help", "100");
    let flat = plan.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("[possible values: Refuse, Convert, Warn, Off]"),
        "{plan}"
    );
    assert!(flat.contains("--mode <MODE>"), "{plan}");
    let run = run_help(&["run".into()], "--help", "100");
    for flag in [
        "--resync <DURATION>",
        "--stall-after <DURATION>",
        "--restart-quiet-cascades-after <DURATION>",
        "--leader-election-lease-duration <DURATION>",
        "--leader-election-renew-interval <DURATION>",
    ] {
        assert!(run.contains(flag), "run --help: no {flag}:\n{run}");
    }
    // The old names still parse (tests/api_server and the chart's older
    // releases pass them), and are not offered.
    for old in [
        "--resync-seconds",
        "--leader-election-lease-seconds",
        "--interval-ms",
    ] {
        assert!(!run.contains(old), "run --help offers {old}");
    }
    let trace = run_help(&["trace".into()], "--help", "100");
    assert!(trace.contains("--interval <DURATION>"), "{trace}");
    assert!(trace.contains("--timeout <DURATION>"), "{trace}");
}

#[test]
fn help_is_wrapped_to_the_terminal() {
    for columns in [100, 80] {
        for path in commands() {
            for flag in ["-h", "--help"] {
                let help = run_help(&path, flag, &columns.to_string());
                for line in help.lines() {
                    assert!(
                        line.chars().count() <= columns,
                        "cascade-guard {} {flag} with COLUMNS={columns}: a line of {} characters:\n{line}",
                        path.join(" "),
                        line.chars().count()
                    );
                }
            }
        }
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cg-help-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// A Crossplane package's apis/: an XRD and its Composition, as the render
/// examples expect in the directory they run in.
fn package_apis(dir: &Path) {
    let apis = dir.join("apis");
    std::fs::create_dir_all(&apis).expect("apis/");
    std::fs::write(
        apis.join("definition.yaml"),
        "apiVersion: apiextensions.crossplane.io/v2
kind: CompositeResourceDefinition
metadata:
  name: inferenceclusters.modelplane.ai
spec:
  group: modelplane.ai
  names: {kind: InferenceCluster, plural: inferenceclusters}
  scope: Cluster
  versions: [{name: v1alpha1, served: true, referenceable: true}]
",
    )
    .expect("XRD");
    std::fs::write(
        apis.join("composition.yaml"),
        "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata: {name: inferenceclusters}
spec: {compositeTypeRef: {apiVersion: modelplane.ai/v1alpha1, kind: InferenceCluster}}
",
    )
    .expect("Composition");
}

/// The commands that need no cluster: what the examples of these run.
fn needs_no_cluster(line: &str) -> bool {
    let words: Vec<&str> = line
        .split_whitespace()
        .skip_while(|w| *w != "cascade-guard" && *w != "<(cascade-guard")
        .collect();
    match words.get(1).copied() {
        Some("render") => !line.contains("--static") || line.contains("--kubernetes-version"),
        Some("crd" | "completion") => true,
        Some("version") => line.contains("--client"),
        _ => false,
    }
}

/// Runs each example line of every command's help that needs no cluster,
/// as written, in bash, in a directory with a package's apis/ and its own
/// HOME, with the binary first on PATH. zsh's examples run in zsh where it
/// is installed.
#[test]
fn the_examples_that_need_no_cluster_run_as_written() {
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = Vec::new();
    for command in commands() {
        let help = run_help(&command, "--help", "100");
        let examples = section(&help, "Examples:");
        // Each example is a comment, then its lines; a line is run with the
        // ones before it in its example (`mkdir -p ...` before the write).
        let mut example: Vec<&str> = Vec::new();
        for line in examples.iter().map(|l| l.trim()) {
            if line.is_empty() || line.starts_with('#') {
                example.clear();
                continue;
            }
            example.push(line);
            if !needs_no_cluster(line) {
                continue;
            }
            let shell = if line.contains("completion zsh") {
                "zsh"
            } else {
                "bash"
            };
            if shell == "zsh" && !installed("zsh") {
                skip::skipped(&format!("zsh is not installed, so `{line}` is not run"));
                continue;
            }
            let dir = temp_dir(&format!("example-{}", ran.len()));
            package_apis(&dir);
            let out = Command::new(shell)
                .args(["-c", &format!("set -e\n{}", example.join("\n"))])
                .current_dir(&dir)
                .env("HOME", &dir)
                .env("PATH", &path)
                .env_remove("KUBECONFIG")
                .output()
                .expect("the shell runs");
            assert!(
                out.status.success(),
                "`{line}` (cascade-guard {} --help) failed: {}",
                command.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            ran.push(line.to_string());
        }
    }
    // Not an empty pass: the render, crd, completion and version examples.
    for wanted in [
        "render apis/",
        "crd >",
        "completion bash",
        "version --client",
    ] {
        assert!(
            ran.iter().any(|l| l.contains(wanted)),
            "no example with `{wanted}` ran: {ran:?}"
        );
    }
}

fn installed(shell: &str) -> bool {
    Command::new(shell)
        .args(["-c", "exit 0"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The code a command's help lists for the line that mentions `about`.
fn listed_code(command: &str, about: &str) -> i32 {
    let help = run_help(&[command.to_string()], "--help", "100");
    let line = section(&help, "Exit codes:")
        .into_iter()
        .find(|l| l.contains(about))
        .unwrap_or_else(|| panic!("{command} --help lists no exit code for {about:?}:\n{help}"));
    line.split_whitespace()
        .next()
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("{command} --help: {line:?} starts with no code"))
}

fn exit_code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

/// What the help says a command exits with is what it exits with: run each
/// way that needs no cluster.
#[test]
fn the_exit_codes_in_the_help_are_the_ones_returned() {
    let dir = temp_dir("exit");
    let kubeconfig = no_cluster::kubeconfig(&dir);
    let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("cascade-guard runs")
    };
    for command in ["plan", "trace", "status", "uninstall"] {
        let mut args = vec![command];
        if matches!(command, "plan" | "trace") {
            args.push("inferencecluster/prod");
        }
        args.extend(["--kubeconfig", kubeconfig]);
        assert_eq!(
            exit_code(&run(&args)),
            listed_code(command, "cannot be reached"),
            "{args:?}"
        );
        assert_eq!(
            exit_code(&run(&[command, "--no-such-flag"])),
            listed_code(command, "the command line is wrong"),
            "{command} --no-such-flag"
        );
    }
    assert_eq!(
        exit_code(&run(&["version", "--kubeconfig", kubeconfig])),
        listed_code("version", "cannot be reached")
    );
    // render: a problem in the input, and nothing written.
    let apis = dir.join("bad");
    std::fs::create_dir_all(&apis).expect("dir");
    std::fs::write(apis.join("x.yaml"), "kind: [").expect("file");
    let out = run(&["render", apis.to_str().expect("UTF-8")]);
    assert_eq!(
        exit_code(&out),
        listed_code("render", "a problem in the input")
    );
    assert!(out.stdout.is_empty(), "a failed render wrote output");
    package_apis(&dir);
    let out = run(&["render", dir.join("apis").to_str().expect("UTF-8")]);
    assert_eq!(exit_code(&out), listed_code("render", "written"));
}
