//! How long the controller waits before trying again: a watch that broke, and
//! a step on one object that failed.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// The first wait after a watch breaks.
const WATCH_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between tries. kube's default (30 s, client-go's) left a
/// kind unwatched for up to half a minute after the API server came back;
/// cascade-guard holds objects as they are created, so it must be back within
/// seconds, and after a restart a watch often fails twice (refused, then its
/// resourceVersion too old for the new watch cache). A watch per Convert kind
/// trying every 2 s costs a down API server little (a refused connection).
const WATCH_MOST: Duration = Duration::from_secs(2);

/// How long a watch must go without failing, past its last wait, before its
/// waits start again from the first: kube's watcher yields an `Init` event
/// at every retry, before its list fails again, and each yielded event
/// resets the backoff; counted, a watch of an unreachable API server retried
/// every 0.25 s for ever (80 log lines a second from `run`).
const SETTLED: Duration = Duration::from_secs(1);

/// Retry delays for every watch the controller runs: 0.25 s doubling to 2 s,
/// each shortened by up to a quarter at random so that many watches do not
/// retry in step; back to 0.25 s once a watch has delivered for a while
/// ([`SETTLED`]).
#[derive(Debug, Default)]
pub struct WatchBackoff {
    failures: u32,
    /// When the last wait began, and how long it was.
    last: Option<(Instant, Duration)>,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = watch_wait(self.failures).mul_f64(1.0 - 0.25 * jitter());
        self.failures = self.failures.saturating_add(1);
        self.last = Some((Instant::now(), wait));
        Some(wait)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.reset_at(Instant::now());
    }
}

impl WatchBackoff {
    /// A reset at `now` counts only once the watch has gone [`SETTLED`]
    /// past its last wait without failing.
    fn reset_at(&mut self, now: Instant) {
        let settled = self
            .last
            .is_none_or(|(at, wait)| now.saturating_duration_since(at) > wait + SETTLED);
        if settled {
            self.failures = 0;
            self.last = None;
        }
    }
}

/// An event that shows a watch working: anything but the `Init` kube's
/// watcher yields before each (re)list, failing or not.
pub(crate) fn delivers<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}

/// The wait after `failures` failed tries, before jitter.
fn watch_wait(failures: u32) -> Duration {
    WATCH_FIRST
        .saturating_mul(1u32 << failures.min(8))
        .min(WATCH_MOST)
}

/// A number in [0, 1) from the clock's nanoseconds: enough to spread retries.
fn jitter() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(nanos % 1000) / 1000.0
}

/// The first failure of a watch in a row is a warning; the retries that
/// follow (every few seconds) are debug lines, so a lasting failure is one
/// line in the log, not one a second.
pub(crate) fn log_watch_error(failing: &mut bool, what: &str, e: &watcher::Error) {
    if std::mem::replace(failing, true) {
        tracing::debug!(error = %e, "still cannot watch {what}; retrying");
    } else {
        tracing::warn!(error = %e, "cannot watch {what}; retrying every few seconds");
    }
}

/// How long to wait before retrying a step that failed `failures` times in
/// a row: 2 s, doubling, at most 5 minutes (a webhook that refuses every
/// write should not get hundreds of requests a second).
pub fn step_retry(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(8);
    Duration::from_secs(2u64 << doublings).min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_retry_within_seconds() {
        let waits: Vec<u128> = (0..7).map(|n| watch_wait(n).as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 2000, 2000, 2000]);
        assert_eq!(watch_wait(u32::MAX), WATCH_MOST);
        let mut b = WatchBackoff::default();
        for _ in 0..20 {
            let wait = b.next().unwrap_or_default();
            assert!(
                wait <= WATCH_MOST && wait >= WATCH_FIRST.mul_f64(0.75),
                "{wait:?}"
            );
        }
        // A reset right after a wait (kube's watcher's Init before its list
        // fails again) does not count; one after the watch ran a while does.
        let (at, wait) = b.last.expect("a wait was given");
        b.reset_at(at + wait);
        assert!(b.next().unwrap_or_default() >= WATCH_MOST.mul_f64(0.75));
        let (at, wait) = b.last.expect("a wait was given");
        b.reset_at(at + wait + SETTLED + Duration::from_millis(1));
        assert!(b.next().unwrap_or_default() <= WATCH_FIRST);
        // Never failed: a reset is a reset.
        let mut fresh = WatchBackoff::default();
        fresh.reset();
        assert!(fresh.next().unwrap_or_default() <= WATCH_FIRST);
    }

    #[test]
    fn steps_back_off_to_five_minutes() {
        let cases = [
            (0, 2),
            (1, 2),
            (2, 4),
            (3, 8),
            (5, 32),
            (8, 256),
            (9, 300),
            (u32::MAX, 300),
        ];
        for (failures, seconds) in cases {
            assert_eq!(
                step_retry(failures),
                Duration::from_secs(seconds),
                "{failures}"
            );
        }
    }
}
