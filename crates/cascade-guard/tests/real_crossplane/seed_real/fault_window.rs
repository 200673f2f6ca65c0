//! Who may use the shared stack while a randomized round kills its parts.
//!
//! Every test shares the stack; a round with faults (SIGKILLed Crossplane,
//! providers, cascade-guard, a restarted kube-apiserver) must have it alone.
//! Unlike a fair read-write lock, a round waiting here does not stop tests
//! from starting: it gets the stack only once no test holds it, so it runs
//! after every other test. With a fair lock (tokio's `RwLock`) each test that
//! started while the round waited for the running ones to end sat idle in
//! its slot (a warm run at 6568816: 10 of the 16 slots waited 180 to 270 s), and
//! those tests ran after the round, adding its window and its drain to the
//! binary's time.

use std::sync::Mutex;

use tokio::sync::Notify;

#[derive(Default)]
pub struct FaultWindow {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    sharers: usize,
    owned: bool,
}

impl FaultWindow {
    /// A hold for a test that uses the stack: waits only while a round owns
    /// it.
    pub async fn share(&'static self) -> Sharing {
        self.wait_until(|s| {
            if s.owned {
                return false;
            }
            s.sharers += 1;
            true
        })
        .await;
        Sharing(self)
    }

    /// The stack to itself, for a round with faults: once no test shares it
    /// (and no other round owns it).
    pub async fn own(&'static self) -> Owning {
        self.wait_until(|s| {
            if s.owned || s.sharers > 0 {
                return false;
            }
            s.owned = true;
            true
        })
        .await;
        Owning(self)
    }

    /// Runs `take` on the state until it succeeds, waiting for a change
    /// between tries.
    async fn wait_until(&self, mut take: impl FnMut(&mut State) -> bool) {
        loop {
            // Registered before the state is read, so that a release between
            // the read and the wait still wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if take(&mut state) {
                    return;
                }
            }
            changed.await;
        }
    }

    fn release(&self, give_back: impl FnOnce(&mut State)) {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            give_back(&mut state);
        }
        self.changed.notify_waiters();
    }
}

/// A test's share of the stack, given back when dropped.
pub struct Sharing(&'static FaultWindow);

impl Drop for Sharing {
    fn drop(&mut self) {
        self.0.release(|s| s.sharers -= 1);
    }
}

/// A round's ownership of the stack, given back when dropped.
pub struct Owning(&'static FaultWindow);

impl Drop for Owning {
    fn drop(&mut self) {
        self.0.release(|s| s.owned = false);
    }
}
