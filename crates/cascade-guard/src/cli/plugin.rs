//! Run as a kubectl plugin: `kubectl cascade-guard ...`. kubectl runs the
//! executable `kubectl-NAME` it finds on PATH for `kubectl NAME`, a `-` in
//! the name spelled `_` in the file's (so that `kubectl cascade guard` could
//! not mean it), and passes it the arguments after NAME.

use std::ffi::OsStr;
use std::path::Path;

/// The file name kubectl looks for on PATH for `kubectl cascade-guard`.
pub const PLUGIN_FILE: &str = "kubectl-cascade_guard";

/// How a person typed the command, given the executable's path (argv[0]):
/// `kubectl cascade-guard` when it runs as the plugin, so that usage and
/// help show what to type; `None` for any other name (clap then takes the
/// file name, as for every command).
pub fn command_name(argv0: &OsStr) -> Option<String> {
    let file = Path::new(argv0).file_name()?.to_str()?;
    let plugin = file.strip_prefix("kubectl-")?;
    (!plugin.is_empty()).then(|| format!("kubectl {}", plugin.replace('_', "-")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_is_named_as_kubectl_runs_it() {
        let name = |s: &str| command_name(OsStr::new(s));
        assert_eq!(
            name("/home/me/.krew/bin/kubectl-cascade_guard").as_deref(),
            Some("kubectl cascade-guard")
        );
        assert_eq!(name(PLUGIN_FILE).as_deref(), Some("kubectl cascade-guard"));
        assert_eq!(name("/usr/local/bin/cascade-guard"), None);
        assert_eq!(name("kubectl-"), None);
        assert_eq!(name(""), None);
    }
}
