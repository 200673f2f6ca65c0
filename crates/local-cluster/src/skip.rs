//! A test that has nothing to run where it runs (a Crossplane or Kubernetes
//! release without what it tests) passes, and says so in one line that
//! scripts/test.sh counts and names in its summary:
//!
//! `cascade-guard-test: SKIPPED <test>: <reason>`
//!
//! Here, in the harness both crates' tests use, so that the form is written
//! in one place.

use std::io::Write;

/// The line's fixed start, which scripts/test.sh greps for.
const SKIPPED: &str = "cascade-guard-test: SKIPPED";

/// Says that the running test skipped, and why. Written to the process's
/// stderr itself: libtest keeps `eprintln!` of a passing test to itself, and
/// the line must reach the log. libtest names each test's thread after it.
pub fn skipped(reason: &str) {
    let thread = std::thread::current();
    let test = thread
        .name()
        .expect("a test's thread is named after the test (libtest names it)");
    let line = format!("{SKIPPED} {test}: {reason}\n");
    // One write, so that lines of tests running at once do not interleave.
    std::io::stderr()
        .lock()
        .write_all(line.as_bytes())
        .expect("write to stderr");
}
