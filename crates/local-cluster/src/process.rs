//! Starting and stopping the component processes, by their process ids.
//!
//! Two lifetimes:
//! - `Lifetime::Owned`: the processes die with the process that started them
//!   (tests). They get `PR_SET_PDEATHSIG`, which fires when the *thread* that
//!   forked them exits, so they are forked from one thread that lives as long as
//!   the process rather than from a test's (short-lived) runtime thread.
//! - `Lifetime::Detached`: the processes outlive the command that started them
//!   (`local-cluster up`), in their own session; `local-cluster down` stops them by
//!   the ids recorded in the state file.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    Owned,
    Detached,
}

/// One running component: its name, id and log file.
#[derive(Debug)]
pub struct Process {
    pub name: String,
    pub pid: u32,
    pub binary: PathBuf,
    pub log: PathBuf,
    /// How it was started, to start it again ([`Process::restart`],
    /// [`Process::start_again`]); None for an adopted process.
    launch: Option<(Vec<String>, Lifetime, Surroundings)>,
    child: Option<Child>,
}

impl Process {
    /// A process started elsewhere (by `local-cluster up`), known only by its id.
    pub fn adopt(name: String, pid: u32, binary: PathBuf, log: PathBuf) -> Self {
        Self {
            name,
            pid,
            binary,
            log,
            launch: None,
            child: None,
        }
    }

    /// Stops the process (SIGTERM, as a node's kubelet would on a restart),
    /// leaves it stopped for `downtime`, and starts it again with the same
    /// arguments and log. Only for processes started here.
    pub fn restart(&mut self, downtime: Duration) -> Result<(), Error> {
        self.stop(Duration::from_secs(10));
        std::thread::sleep(downtime);
        self.start_again()
    }

    /// Starts a process that has exited (or was killed) again, with the same
    /// arguments, log and surroundings (its network namespace included); does
    /// nothing while it still runs. Only for processes started here.
    pub fn start_again(&mut self) -> Result<(), Error> {
        let Some((args, lifetime, surroundings)) = self.launch.clone() else {
            return Err(Error::NotRestartable {
                component: self.name.clone(),
            });
        };
        if self.is_running() {
            return Ok(());
        }
        self.reap();
        *self = spawn_with(
            &self.name,
            &self.binary,
            &args,
            &self.log,
            lifetime,
            surroundings,
        )?;
        Ok(())
    }

    /// Whether the process is still running and is still the binary we started
    /// (an id can be reused after a process exits).
    pub fn is_running(&mut self) -> bool {
        if let Some(child) = self.child.as_mut() {
            return matches!(child.try_wait(), Ok(None));
        }
        is_running_binary(self.pid, &self.binary)
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the process to be gone.
    pub fn stop(&mut self, grace: Duration) {
        if !self.is_running() {
            self.reap();
            return;
        }
        let pid = Pid::from_raw(self.pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.is_running() {
                self.reap();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = kill(pid, Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.reap();
    }

    /// SIGKILL at once, as a node failure or the OOM killer would: no chance
    /// to clean up.
    pub fn kill(&mut self) {
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.reap();
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// The last `lines` lines of the component's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Only owned processes are ours to stop on drop; detached ones belong to
        // the state file.
        if self.child.is_some() {
            self.stop(Duration::from_secs(5));
        }
    }
}

/// Where a Go program's log says it crashed (`fatal error: ...` or
/// `panic: ...` at the start of a line), with the `lines` after it: a crash
/// ends in a dump of every goroutine, so the log's tail seldom shows why.
pub fn log_crash(path: &Path, lines: usize) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let all: Vec<&str> = text.lines().collect();
    let at = all
        .iter()
        .position(|l| l.starts_with("fatal error: ") || l.starts_with("panic: "))?;
    Some(all[at..all.len().min(at + 1 + lines)].join("\n"))
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    all[start..].join("\n")
}

fn is_running_binary(pid: u32, binary: &Path) -> bool {
    // A zombie still has /proc/<pid>, but no exe link.
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(exe) => {
            exe == binary
                || exe.to_string_lossy().trim_end_matches(" (deleted)") == binary.to_string_lossy()
        }
        Err(_) => false,
    }
}

/// Starts `binary args...` with stdout and stderr appended to `log`.
pub fn spawn(
    name: &str,
    binary: &Path,
    args: &[String],
    log: &Path,
    lifetime: Lifetime,
) -> Result<Process, Error> {
    spawn_with(name, binary, args, log, lifetime, Surroundings::default())
}

/// What a process gets besides its arguments: extra environment variables,
/// and a network namespace to run in instead of ours.
#[derive(Clone, Debug, Default)]
pub struct Surroundings {
    pub env: Vec<(OsString, OsString)>,
    /// An open `/proc/.../ns/net`; the process joins it before it runs.
    pub network_namespace: Option<Arc<OwnedFd>>,
}

/// [`spawn`], in the given surroundings.
pub fn spawn_with(
    name: &str,
    binary: &Path,
    args: &[String],
    log: &Path,
    lifetime: Lifetime,
    surroundings: Surroundings,
) -> Result<Process, Error> {
    let request = SpawnRequest {
        binary: binary.to_path_buf(),
        args: args.to_vec(),
        log: log.to_path_buf(),
        lifetime,
        surroundings: surroundings.clone(),
    };
    let child = match lifetime {
        Lifetime::Detached => request.run(),
        Lifetime::Owned => spawner_thread(request)?,
    }
    .map_err(|source| Error::Spawn {
        component: name.to_string(),
        binary: binary.to_path_buf(),
        source,
    })?;
    let pid = child.id();
    Ok(Process {
        name: name.to_string(),
        pid,
        binary: std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf()),
        log: log.to_path_buf(),
        launch: Some((args.to_vec(), lifetime, surroundings)),
        child: match lifetime {
            Lifetime::Owned => Some(child),
            // Dropping a std Child neither kills nor waits: the session leader
            // outlives us and init reaps it.
            Lifetime::Detached => None,
        },
    })
}

struct SpawnRequest {
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    lifetime: Lifetime,
    surroundings: Surroundings,
}

impl SpawnRequest {
    fn run(self) -> std::io::Result<Child> {
        let out = File::options().create(true).append(true).open(&self.log)?;
        let err = out.try_clone()?;
        let mut command = Command::new(&self.binary);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .envs(self.surroundings.env.iter().map(|(k, v)| (k, v)));
        let lifetime = self.lifetime;
        let network_namespace = self.surroundings.network_namespace.clone();
        #[allow(unsafe_code)]
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe system calls (prctl, setsid, setns).
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                match lifetime {
                    Lifetime::Owned => nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?,
                    Lifetime::Detached => {
                        nix::unistd::setsid()?;
                    }
                }
                if let Some(ns) = &network_namespace {
                    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
                }
                Ok(())
            });
        }
        command.spawn()
    }
}

type Reply = mpsc::Sender<std::io::Result<Child>>;

/// Forks owned processes from one thread that never exits (see the module docs).
fn spawner_thread(request: SpawnRequest) -> Result<std::io::Result<Child>, Error> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(SpawnRequest, Reply)>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(SpawnRequest, Reply)>();
        std::thread::Builder::new()
            .name("local-cluster-spawner".into())
            .spawn(move || {
                for (request, reply) in rx {
                    let _ = reply.send(request.run());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| tracing::error!("cannot start the spawner thread: {e}"));
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .map_err(|_| Error::Spawner)?
        .send((request, reply_tx))
        .map_err(|_| Error::Spawner)?;
    reply_rx.recv().map_err(|_| Error::Spawner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_is_found_above_its_goroutine_dump() {
        let dir = std::env::temp_dir().join(format!("local-cluster-crash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let log = dir.join("kube-apiserver.log");
        let mut text = String::from(
            "I1208 started\nfatal error: concurrent map read and map write\n\ngoroutine 9 [running]:\n",
        );
        text.push_str(&"\tframe\n".repeat(500));
        std::fs::write(&log, &text).expect("log");
        let crash = log_crash(&log, 2).expect("a crash");
        assert_eq!(
            crash,
            "fatal error: concurrent map read and map write\n\ngoroutine 9 [running]:"
        );
        std::fs::write(&log, "I1208 started\nE1208 panic: not at the start\n").expect("log");
        assert_eq!(log_crash(&log, 2), None);
        assert_eq!(log_crash(&dir.join("missing.log"), 2), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
