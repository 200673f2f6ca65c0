//! The API server's audit log, checked before it is read:
//! `local_cluster::audit` reads a file it cannot read as a log with no
//! events, which every "nothing was refused" and "no such delete" passes.

use std::path::PathBuf;

use local_cluster::ControlPlane;

/// The path of `cp`'s audit log, for `local_cluster::audit`; fails naming it
/// when it is not a file that can be read, or is empty (a control plane
/// that served the test has written events).
pub fn audit_log(cp: &ControlPlane) -> PathBuf {
    let path = cp.audit_log_path();
    let size = std::fs::File::open(&path)
        .and_then(|f| f.metadata())
        .map(|m| (m.is_file(), m.len()));
    match size {
        Ok((true, len)) if len > 0 => path,
        Ok((true, _)) => panic!("the API server's audit log {} is empty", path.display()),
        Ok((false, _)) => panic!(
            "the API server's audit log {} is not a file",
            path.display()
        ),
        Err(e) => panic!(
            "cannot read the API server's audit log {}: {e}",
            path.display()
        ),
    }
}
