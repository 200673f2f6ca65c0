//! cascade-guard's container image, for tests/api_server/install.rs: scripts/image.sh
//! builds it and pushes it to a registry on loopback (the pinned crane's
//! `crane registry serve`, started here and gone with the test process); the
//! tests point the chart's image values at it, pull it back, and run the
//! binary its config names as the entrypoint, taken out of its layer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use local_cluster::process::{self, Lifetime, Process};
use serde_json::Value;

use crate::chart::pinned_tool;

/// The pinned crane (testbed/tools/crane.sh; CRANE_BIN when scripts/test.sh set it).
pub fn crane() -> PathBuf {
    pinned_tool("CRANE_BIN", "crane.sh")
}

/// The image as pushed: what the chart's `image.repository` and
/// `image.digest` take.
pub struct Pushed {
    pub repository: String,
    pub digest: String,
    /// The registry serving it; never dropped (a static), it dies with the
    /// test process.
    _registry: Process,
}

impl Pushed {
    pub fn reference(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }

    /// The chart values that install this image.
    pub fn values(&self) -> String {
        format!(
            "image:\n  repository: {}\n  digest: {}\n",
            self.repository, self.digest
        )
    }
}

/// The image of this checkout, built and pushed once per test process.
pub fn pushed() -> &'static Pushed {
    static PUSHED: OnceLock<Pushed> = OnceLock::new();
    PUSHED.get_or_init(|| {
        let (registry, address) = start_registry();
        let reference = push(&format!("{address}/cascade-guard/cascade-guard:test"));
        let (repository, digest) = reference
            .split_once('@')
            .unwrap_or_else(|| panic!("scripts/image.sh printed no digest: {reference}"));
        Pushed {
            repository: repository.to_string(),
            digest: digest.to_string(),
            _registry: registry,
        }
    })
}

/// `scripts/image.sh push TAG`: the REPOSITORY@DIGEST it pushed.
pub fn push(tag: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["push", tag])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/image.sh push {tag} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or_default().trim().to_string()
}

/// `crane registry serve` on a free loopback port, in memory; its address.
fn start_registry() -> (Process, String) {
    // Removed by a later start once this test binary is gone.
    let dir = local_cluster::new_scratch_dir().expect("registry dir");
    let log = dir.join("registry.log");
    let registry = process::spawn(
        "registry",
        &crane(),
        &["registry", "serve", "--address", "127.0.0.1:0"].map(String::from),
        &log,
        Lifetime::Owned,
    )
    .unwrap_or_else(|e| panic!("cannot start crane registry serve: {e}"));
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(port) = served_port(&text) {
            return (registry, format!("127.0.0.1:{port}"));
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "crane registry serve did not say its port within 30 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The port in crane registry serve's "serving on port N" log line.
fn served_port(log: &str) -> Option<u16> {
    log.lines()
        .find_map(|l| l.split_once("serving on port ").map(|(_, p)| p.trim()))
        .and_then(|p| p.parse().ok())
}

/// `crane ARGS...`'s standard output; panics with its error output.
pub fn crane_output(args: &[&str]) -> Vec<u8> {
    let out = Command::new(crane())
        .args(args)
        .output()
        .expect("crane runs");
    assert!(
        out.status.success(),
        "crane {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The image's config (`crane config`).
pub fn config(image: &str) -> Value {
    serde_json::from_slice(&crane_output(&["config", image])).expect("the image config is JSON")
}

/// The image's manifest (`crane manifest`).
pub fn manifest(image: &str) -> Value {
    serde_json::from_slice(&crane_output(&["manifest", image])).expect("the manifest is JSON")
}

/// The binary a container of `image` runs: its config's entrypoint, taken out
/// of the image's filesystem (`crane export`, pulled from the registry).
/// Once per image.
pub fn entrypoint_binary(image: &str) -> PathBuf {
    static TAKEN: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = taken.get_or_insert_with(HashMap::new).get(image) {
        return path.clone();
    }
    let entrypoint = config(image)["config"]["Entrypoint"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{image} has no entrypoint"))
        .to_string();
    let member = entrypoint
        .strip_prefix('/')
        .unwrap_or_else(|| panic!("{image}'s entrypoint {entrypoint} is not an absolute path"));
    let dir = std::env::temp_dir().join(format!(
        "cascade-guard-image-{}-{}",
        std::process::id(),
        taken.as_ref().map_or(0, HashMap::len)
    ));
    std::fs::create_dir_all(&dir).expect("image dir");
    let filesystem = dir.join("filesystem.tar");
    let filesystem_arg = filesystem.to_string_lossy().into_owned();
    crane_output(&["export", image, &filesystem_arg]);
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&filesystem)
        .arg("-C")
        .arg(&dir)
        .arg(member)
        .status()
        .expect("tar runs");
    assert!(status.success(), "{image} has no {entrypoint}");
    let _ = std::fs::remove_file(&filesystem);
    let binary = dir.join(member);
    taken
        .get_or_insert_with(HashMap::new)
        .insert(image.to_string(), binary.clone());
    binary
}

/// Whether an ELF file names a program interpreter (PT_INTERP): a dynamic
/// executable does, a static one does not. Only 64-bit little-endian ELF.
pub fn has_interpreter(elf: &[u8]) -> Result<bool, String> {
    const PT_INTERP: u32 = 3;
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    let truncated = || "truncated ELF header".to_string();
    let table = usize::try_from(u64_at(0x20).ok_or_else(truncated)?).map_err(|e| e.to_string())?;
    let entry = usize::from(u16_at(0x36).ok_or_else(truncated)?);
    let count = usize::from(u16_at(0x38).ok_or_else(truncated)?);
    for i in 0..count {
        let kind =
            u32_at(table + i * entry).ok_or_else(|| "truncated program headers".to_string())?;
        if kind == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}

#[test]
fn the_registry_port_is_read_from_its_log() {
    let log = "2026/12/01 07:30:00 serving on port 40123\n";
    assert_eq!(served_port(log), Some(40123));
    assert_eq!(served_port("starting\n"), None);
}

#[test]
fn a_dynamic_executable_has_an_interpreter_and_garbage_is_an_error() {
    let this = std::fs::read(std::env::current_exe().expect("the test binary")).expect("readable");
    // The test binary is the host's (glibc) build: dynamic.
    assert_eq!(has_interpreter(&this), Ok(true));
    assert!(has_interpreter(b"#!/bin/sh\n").is_err());
    assert!(has_interpreter(b"\x7fELF\x02\x01").is_err());
}
