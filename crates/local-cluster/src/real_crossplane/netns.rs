//! A network namespace of its own for a process that binds fixed ports on every
//! interface (the providers' `:8080` and `:9443`, the function SDK's `:8080`),
//! so that any number of them, and anything else on this machine, can run at
//! once without racing for those ports.
//!
//! The namespace has only a loopback interface. Loopback ports are carried
//! across by forwarders in this process: a socket belongs to the namespace it
//! was created in, whichever thread later uses it, so a listener made inside
//! (by a thread that joined the namespace) and a connection made outside (by
//! any other thread) join the two loopbacks.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;

use nix::sched::{CloneFlags, setns, unshare};
use tokio::task::AbortHandle;

use super::Error;

/// After a failed accept (out of file descriptors, say), before the next.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// A network namespace, kept alive by an open handle to it.
#[derive(Clone, Debug)]
pub struct NetNamespace {
    handle: Arc<OwnedFd>,
}

impl NetNamespace {
    /// A new namespace with its loopback interface up. Needs CAP_SYS_ADMIN
    /// (root).
    pub fn create() -> Result<Self, Error> {
        in_new_thread(|| {
            unshare(CloneFlags::CLONE_NEWNET).map_err(|e| Error::Namespace(e.to_string()))?;
            // A child forked from this thread starts in this thread's namespace.
            let status = Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .map_err(|e| Error::Namespace(format!("cannot run `ip link set lo up`: {e}")))?;
            if !status.success() {
                return Err(Error::Namespace(format!(
                    "`ip link set lo up` failed: {status}"
                )));
            }
            let file = std::fs::File::open("/proc/thread-self/ns/net")
                .map_err(|e| Error::Namespace(format!("/proc/thread-self/ns/net: {e}")))?;
            Ok(Self {
                handle: Arc::new(OwnedFd::from(file)),
            })
        })
    }

    /// The handle a process joins to run in the namespace.
    pub fn handle(&self) -> Arc<OwnedFd> {
        self.handle.clone()
    }

    /// Carries 127.0.0.1:`port` inside the namespace to 127.0.0.1:`port`
    /// outside (a server the process inside must reach), on `runtime`, until
    /// the returned handle aborts it (then the port is closed inside).
    pub fn forward_out(
        &self,
        port: u16,
        runtime: &tokio::runtime::Handle,
    ) -> Result<AbortHandle, Error> {
        let listener = self.inside(move || {
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(forward_error(port))
        })?;
        relay(listener, port, runtime, move || async move {
            tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .await
                .ok()
        })
    }

    /// Carries a new loopback port outside to 127.0.0.1:`port` inside the
    /// namespace (a server the process inside offers), on `runtime`. Returns
    /// the outside port: the system picks it, so nothing else can hold it.
    pub fn forward_in(
        &self,
        port: u16,
        runtime: &tokio::runtime::Handle,
    ) -> Result<(u16, AbortHandle), Error> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(forward_error(port))?;
        let outside = listener.local_addr().map_err(forward_error(port))?.port();
        let namespace = self.clone();
        let forwarder = relay(listener, port, runtime, move || {
            let namespace = namespace.clone();
            async move {
                // The connection must be made from a thread inside.
                let connected = tokio::task::spawn_blocking(move || {
                    namespace.inside(move || {
                        let stream =
                            TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                                .map_err(forward_error(port))?;
                        stream.set_nonblocking(true).map_err(forward_error(port))?;
                        Ok(stream)
                    })
                })
                .await;
                tokio::net::TcpStream::from_std(connected.ok()?.ok()?).ok()
            }
        })?;
        Ok((outside, forwarder))
    }

    /// Whether something in the namespace accepts connections on
    /// 127.0.0.1:`port`.
    pub fn accepts(&self, port: u16) -> bool {
        self.inside(move || {
            TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                .map(|_| ())
                .map_err(forward_error(port))
        })
        .is_ok()
    }

    /// Runs `f` on a new thread that has joined the namespace.
    fn inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let handle = self.handle.clone();
        in_new_thread(move || {
            setns(handle.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(|e| Error::Namespace(format!("cannot join the namespace: {e}")))?;
            f()
        })
    }
}

/// Namespace changes apply to the calling thread only, so they are made on a
/// thread of their own, which ends with them.
fn in_new_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    std::thread::spawn(f)
        .join()
        .map_err(|_| Error::Namespace("the namespace thread panicked".into()))?
}

/// Accepts on `listener` for ever, on `runtime`, and splices each connection
/// to the one `connect` makes (or drops it, when that fails).
fn relay<C, F>(
    listener: TcpListener,
    port: u16,
    runtime: &tokio::runtime::Handle,
    connect: C,
) -> Result<AbortHandle, Error>
where
    C: Fn() -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Option<tokio::net::TcpStream>> + Send + 'static,
{
    listener
        .set_nonblocking(true)
        .map_err(forward_error(port))?;
    let _guard = runtime.enter();
    let listener = tokio::net::TcpListener::from_std(listener).map_err(forward_error(port))?;
    let connect = Arc::new(connect);
    let task = runtime.spawn(async move {
        loop {
            let Ok((mut accepted, _)) = listener.accept().await else {
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            };
            let connect = connect.clone();
            tokio::spawn(async move {
                if let Some(mut other) = connect().await {
                    let _ = tokio::io::copy_bidirectional(&mut accepted, &mut other).await;
                }
            });
        }
    });
    Ok(task.abort_handle())
}

fn forward_error(port: u16) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Forward {
        port,
        detail: e.to_string(),
    }
}
