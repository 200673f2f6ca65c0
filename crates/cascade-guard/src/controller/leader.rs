//! Leader election on a coordination.k8s.io/v1 Lease, so that of several
//! replicas only one writes.
//!
//! The protocol is client-go's: a candidate takes the Lease when nobody holds
//! it, or when the holder has not renewed it for `leaseDurationSeconds`; every
//! write carries the resourceVersion it was based on, so that of two candidates
//! racing for the same Lease the API server lets exactly one through.
//!
//! Expiry is judged by the candidate's own monotonic clock, from the moment it
//! saw the Lease's spec last change, never by comparing the holder's
//! `renewTime` with the local wall clock: the two machines' clocks may disagree,
//! but durations measured on one machine do not.
//!
//! Once held, a background task renews the Lease. [`Leadership::lost`] resolves
//! when that fails for longer than the lease duration or when someone else took
//! the Lease; the process is then expected to exit.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::Error;

pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// Which Lease to contend for, as whom, and how often.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// Unique per process (the pod name): two processes with the same
    /// identity would both consider themselves the holder.
    pub identity: String,
    /// How long a holder's renewal keeps others off (written to the Lease).
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew_interval: Duration,
    /// How often a candidate looks at a Lease someone else holds.
    pub retry_interval: Duration,
    /// Put on the Lease when this process takes it (what the leader runs
    /// with, for `status`); renewals keep them.
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl LeaseSettings {
    /// Settings with the default durations.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_interval: DEFAULT_RENEW_INTERVAL,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            annotations: Default::default(),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let problem = if self.identity.is_empty() {
            Some("identity is empty")
        } else if self.namespace.is_empty() || self.name.is_empty() {
            Some("the Lease's namespace and name must be set")
        } else if self.lease_duration < Duration::from_secs(1) {
            Some("lease_duration must be at least 1 s (the Lease counts whole seconds)")
        } else if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration {
            Some("renew_interval must be positive and shorter than lease_duration")
        } else if self.retry_interval.is_zero() {
            Some("retry_interval must be positive")
        } else {
            None
        };
        match problem {
            Some(p) => Err(Error::LeaseSettings(p.to_owned())),
            None => Ok(()),
        }
    }

    /// The duration as written to the Lease, rounded up so that others never
    /// wait less than we assume.
    fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// Contends for the Lease until this process holds it, then renews it in the
/// background. Transient API errors are logged and retried; errors that
/// retrying cannot fix (forbidden, invalid) are returned.
pub async fn acquire(client: Client, settings: LeaseSettings) -> Result<Leadership, Error> {
    settings.validate()?;
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut observed: Option<LeaseSeen> = None;
    let mut waiting_for: Option<String> = None;
    loop {
        match try_acquire(&api, &settings, &mut observed).await {
            Ok(Attempt::Won {
                lease,
                previous,
                written_at,
            }) => {
                info!(
                    lease = %settings.name,
                    namespace = %settings.namespace,
                    identity = %settings.identity,
                    previous_holder = previous.as_deref().unwrap_or("<none>"),
                    "acquired leadership"
                );
                return Ok(Leadership::start(api, settings, *lease, written_at));
            }
            Ok(Attempt::Held { holder }) => {
                // Once per holder: the retry loop itself is not news.
                if waiting_for.as_deref() != Some(holder.as_str()) {
                    info!(lease = %settings.name, %holder, "lease held by another replica; waiting");
                    waiting_for = Some(holder);
                }
                tokio::time::sleep(settings.retry_interval).await;
            }
            // Someone wrote between our read and our write: read again now.
            Ok(Attempt::Raced) => debug!(lease = %settings.name, "lost a race for the lease"),
            Err(source) if is_permanent(&source) => {
                return Err(Error::Lease {
                    action: "acquire",
                    namespace: settings.namespace.clone(),
                    name: settings.name.clone(),
                    source: Box::new(source),
                });
            }
            Err(e) => {
                warn!(lease = %settings.name, error = %e, "cannot contend for the lease; retrying");
                tokio::time::sleep(settings.retry_interval).await;
            }
        }
    }
}

/// For a controller run without leader election: keeps the Lease named in
/// `settings` held by this process and renewed, without contending (the
/// operator promised a single replica), so that `status` and `uninstall`
/// find it running. Errors are logged and retried; it never ends.
pub async fn announce(client: Client, settings: LeaseSettings) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut warned = false;
    // The Lease as last written: a renewal replaces it at once, one request;
    // after an error it is read again first.
    let mut written: Option<Lease> = None;
    loop {
        let lease = presence(
            &settings,
            &settings.identity,
            settings.lease_duration_seconds(),
        );
        let result = apply_presence(&api, &settings.name, &lease, written.take()).await;
        match result {
            Ok(now) => {
                written = Some(now);
                warned = false;
            }
            Err(e) if !warned => {
                warn!(lease = %settings.name, error = %e, "cannot announce this controller on its Lease; status and uninstall will not see it running");
                warned = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(settings.renew_interval).await;
    }
}

/// The end of [`announce`]: the Lease left with an empty holder, which
/// nobody reads as running.
pub async fn withdraw(client: Client, settings: &LeaseSettings) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let lease = presence(settings, "", 1);
    if let Err(e) = apply_presence(&api, &settings.name, &lease, None).await {
        warn!(lease = %settings.name, error = %e, "cannot mark this controller stopped on its Lease; it reads as running until the Lease expires");
    }
}

/// The Lease as a controller without leader election writes it: held by
/// `holder` (empty: nobody), renewed now.
fn presence(settings: &LeaseSettings, holder: &str, duration_seconds: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(settings.name.clone()),
            annotations: Some(settings.annotations.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    }
}

/// Writes `lease` as this controller's presence on the Lease `name`, with
/// the verbs leader election uses, which the chart's Role grants on its
/// Lease (create; get and update by name), never patch: an apply was
/// forbidden there, and `status`, `plan` and `uninstall` saw no controller.
/// `known`: the Lease as this process last wrote it, replaced without a read
/// (a conflict, should someone else have written since, is an error and the
/// next write reads first).
async fn apply_presence(
    api: &Api<Lease>,
    name: &str,
    lease: &Lease,
    known: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let params = PostParams {
        field_manager: Some(crate::controller::MANAGER.to_string()),
        ..PostParams::default()
    };
    let live = match known {
        Some(known) => Some(known),
        None => api.get_opt(name).await?,
    };
    match live {
        None => api.create(&params, lease).await,
        Some(live) => {
            let mut next = lease.clone();
            next.metadata.resource_version = live.metadata.resource_version;
            // What others wrote beside ours stays (labels, other annotations).
            next.metadata.labels = live.metadata.labels;
            let mut annotations = live.metadata.annotations.unwrap_or_default();
            annotations.extend(lease.metadata.annotations.clone().unwrap_or_default());
            next.metadata.annotations = Some(annotations);
            api.replace(name, &params, &next).await
        }
    }
}

/// Held leadership. Dropping it stops renewing without giving the Lease up (as
/// if the process died); [`Leadership::release`] gives it up.
pub struct Leadership {
    api: Api<Lease>,
    settings: LeaseSettings,
    leading: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    renewer: Option<JoinHandle<Option<Lease>>>,
}

impl Leadership {
    fn start(api: Api<Lease>, settings: LeaseSettings, lease: Lease, written_at: Instant) -> Self {
        let (flag, leading) = watch::channel(true);
        let (stop, stopped) = oneshot::channel();
        let renewer = tokio::spawn(renew(
            api.clone(),
            settings.clone(),
            lease,
            written_at,
            Leading(flag),
            stopped,
        ));
        Self {
            api,
            settings,
            leading,
            stop: Some(stop),
            renewer: Some(renewer),
        }
    }

    /// Whether we still hold the Lease (as far as the last renewal knows).
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Resolves once leadership is lost: renewal failed for longer than the
    /// lease duration, or another candidate holds the Lease.
    pub async fn lost(&self) {
        let mut leading = self.leading.clone();
        // An error means the renewer is gone, which also ends leadership.
        let _ = leading.wait_for(|leading| !*leading).await;
    }

    /// Stops renewing and gives the Lease up at once (if we still hold it),
    /// so that another replica takes over without waiting for expiry.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            // An error means the renewer has already ended; its result says how.
            let _ = stop.send(());
        }
        let last = match self.renewer.take() {
            Some(renewer) => match renewer.await {
                Ok(Some(lease)) => lease,
                // Leadership was lost: the Lease is not ours to give up.
                Ok(None) => return,
                Err(e) => {
                    warn!(error = %e, "lease renewer failed; releasing from a fresh read");
                    match self.api.get_opt(&self.settings.name).await {
                        Ok(Some(lease)) => lease,
                        Ok(None) => return,
                        Err(e) => {
                            warn!(lease = %self.settings.name, error = %e, "cannot release the lease; it will expire");
                            return;
                        }
                    }
                }
            },
            None => return,
        };
        match give_up(&self.api, &self.settings, last).await {
            Ok(true) => {
                info!(lease = %self.settings.name, identity = %self.settings.identity, "released leadership")
            }
            Ok(false) => {
                debug!(lease = %self.settings.name, "lease no longer ours; nothing to release")
            }
            Err(e) => {
                warn!(lease = %self.settings.name, error = %e, "cannot release the lease; it will expire")
            }
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // A Leadership nobody holds must not keep the Lease alive forever.
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

/// Reports the end of leadership however the renewer ends (return, panic,
/// abort).
struct Leading(watch::Sender<bool>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// A Lease spec as we last saw it change, and when, by our clock.
#[derive(Debug)]
struct LeaseSeen {
    spec: LeaseSpec,
    at: Instant,
}

enum Attempt {
    Won {
        lease: Box<Lease>,
        previous: Option<String>,
        /// Taken just before the winning write: renewal deadlines count from it.
        written_at: Instant,
    },
    Held {
        holder: String,
    },
    Raced,
}

async fn try_acquire(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    observed: &mut Option<LeaseSeen>,
) -> Result<Attempt, kube::Error> {
    let Some(current) = api.get_opt(&settings.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(settings.name.clone()),
                namespace: Some(settings.namespace.clone()),
                annotations: Some(settings.annotations.clone()),
                ..Default::default()
            },
            spec: Some(claimed(
                None,
                &settings.identity,
                settings.lease_duration_seconds(),
                Timestamp::now(),
            )),
        };
        let written_at = Instant::now();
        return match api.create(&PostParams::default(), &lease).await {
            Ok(lease) => Ok(Attempt::Won {
                lease: Box::new(lease),
                previous: None,
                written_at,
            }),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Raced),
            Err(e) => Err(e),
        };
    };
    let spec = current.spec.clone().unwrap_or_default();
    // Taken after the read: the holder renewed no later than this.
    let seen = Instant::now();
    let seen_at = match observed {
        Some(o) if o.spec == spec => o.at,
        _ => {
            *observed = Some(LeaseSeen {
                spec: spec.clone(),
                at: seen,
            });
            seen
        }
    };
    if !may_take_over(
        &spec,
        seen_at,
        Instant::now(),
        &settings.identity,
        settings.lease_duration,
    ) {
        return Ok(Attempt::Held {
            holder: holder(&spec).unwrap_or_default().to_owned(),
        });
    }
    let previous = holder(&spec).map(str::to_owned);
    // `current` carries its resourceVersion: the replace fails if anyone
    // wrote the Lease since we read it.
    let mut next = current;
    next.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .extend(settings.annotations.clone());
    next.spec = Some(claimed(
        Some(&spec),
        &settings.identity,
        settings.lease_duration_seconds(),
        Timestamp::now(),
    ));
    let written_at = Instant::now();
    match api
        .replace(&settings.name, &PostParams::default(), &next)
        .await
    {
        Ok(lease) => Ok(Attempt::Won {
            lease: Box::new(lease),
            previous,
            written_at,
        }),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Raced),
        Err(e) => Err(e),
    }
}

enum Renewal {
    Renewed(Lease),
    /// Someone else wrote the Lease but left it ours: retry on their version.
    Refreshed(Lease),
    /// Another holder, or the Lease is gone.
    Lost(Option<String>),
}

async fn renew(
    api: Api<Lease>,
    settings: LeaseSettings,
    mut lease: Lease,
    mut renewed_at: Instant,
    leading: Leading,
    mut stop: oneshot::Receiver<()>,
) -> Option<Lease> {
    // Dropped on every exit, which tells `lost()`.
    let _leading = leading;
    let mut next_attempt = renewed_at + settings.renew_interval;
    // Give up one renewal interval before the lease could expire for others
    // (client-go's renew deadline does the same), so that a write already in
    // flight cannot overlap with the next leader's.
    let renew_deadline = settings
        .lease_duration
        .saturating_sub(settings.renew_interval);
    loop {
        let deadline = renewed_at + renew_deadline;
        tokio::select! {
            _ = &mut stop => return Some(lease),
            _ = tokio::time::sleep_until(next_attempt.min(deadline)) => {}
        }
        if Instant::now() >= deadline {
            warn!(
                lease = %settings.name,
                lease_duration = ?settings.lease_duration,
                "lost leadership: could not renew the lease in time"
            );
            return None;
        }
        let started = Instant::now();
        next_attempt = started + settings.renew_interval;
        // Bounded by the deadline so that a hung request cannot hide the loss.
        let outcome = tokio::select! {
            _ = &mut stop => return Some(lease),
            r = tokio::time::timeout_at(deadline, renew_once(&api, &settings, &lease)) => r,
        };
        match outcome {
            Ok(Ok(Renewal::Renewed(stored))) => {
                lease = stored;
                renewed_at = started;
            }
            Ok(Ok(Renewal::Refreshed(fresh))) => {
                lease = fresh;
                next_attempt = Instant::now();
            }
            Ok(Ok(Renewal::Lost(holder))) => {
                warn!(
                    lease = %settings.name,
                    holder = holder.as_deref().unwrap_or("<none>"),
                    "lost leadership: another replica holds the lease"
                );
                return None;
            }
            Ok(Err(e)) => warn!(lease = %settings.name, error = %e, "cannot renew the lease"),
            // The deadline passed; the top of the loop reports it.
            Err(_) => {}
        }
    }
}

async fn renew_once(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    lease: &Lease,
) -> Result<Renewal, kube::Error> {
    let mut next = lease.clone();
    let spec = next.spec.get_or_insert_with(Default::default);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    spec.lease_duration_seconds = Some(settings.lease_duration_seconds());
    match api
        .replace(&settings.name, &PostParams::default(), &next)
        .await
    {
        Ok(stored) => Ok(Renewal::Renewed(stored)),
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&settings.name).await? {
            Some(fresh) if holder_of(&fresh) == Some(settings.identity.as_str()) => {
                Ok(Renewal::Refreshed(fresh))
            }
            Some(fresh) => Ok(Renewal::Lost(holder_of(&fresh).map(str::to_owned))),
            None => Ok(Renewal::Lost(None)),
        },
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Renewal::Lost(None)),
        Err(e) => Err(e),
    }
}

/// Clears the holder if the Lease is still ours. Returns whether it was.
async fn give_up(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    mut lease: Lease,
) -> Result<bool, kube::Error> {
    // Two rounds: the first may fail on a version the renewer wrote after we
    // last saw the Lease.
    for _ in 0..2 {
        if holder_of(&lease) != Some(settings.identity.as_str()) {
            return Ok(false);
        }
        let mut next = lease.clone();
        next.spec = Some(released(
            next.spec.as_ref().unwrap_or(&LeaseSpec::default()),
            Timestamp::now(),
        ));
        match api
            .replace(&settings.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&settings.name).await? {
                Some(fresh) => lease = fresh,
                None => return Ok(false),
            },
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

fn is_permanent(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 401 | 403 | 422))
}

/// The holder, if any: client-go writes an empty string for "none".
fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

fn holder_of(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref().and_then(holder)
}

/// How long a renewal keeps others off: the holder's own setting, or ours if
/// the Lease does not say.
fn validity(spec: &LeaseSpec, fallback: Duration) -> Duration {
    match spec.lease_duration_seconds {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs().into()),
        _ => fallback,
    }
}

/// Whether `identity` may claim a Lease whose spec has been unchanged since
/// `seen_at` (our clock): nobody holds it, we hold it (a restart of ours), or
/// the holder has not renewed within the lease duration.
fn may_take_over(
    spec: &LeaseSpec,
    seen_at: Instant,
    now: Instant,
    identity: &str,
    fallback: Duration,
) -> bool {
    match holder(spec) {
        None => true,
        Some(h) if h == identity => true,
        Some(_) => now.saturating_duration_since(seen_at) > validity(spec, fallback),
    }
}

/// The spec with which `identity` claims (or re-claims) the Lease.
fn claimed(
    old: Option<&LeaseSpec>,
    identity: &str,
    duration_seconds: i32,
    now: Timestamp,
) -> LeaseSpec {
    let base = old.cloned().unwrap_or_default();
    let ours = old.and_then(holder) == Some(identity);
    let transitions = match old {
        None => 0,
        // Re-claiming our own Lease (after a restart) is no transition.
        Some(_) if ours => base.lease_transitions.unwrap_or(0),
        Some(_) => base.lease_transitions.unwrap_or(0).saturating_add(1),
    };
    let acquire_time = if ours {
        base.acquire_time.clone().or(Some(MicroTime(now)))
    } else {
        Some(MicroTime(now))
    };
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time,
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..base
    }
}

/// The spec that gives the Lease up: no holder, so that the next candidate
/// takes it on its next look.
fn released(old: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        // client-go writes 1 s too, for candidates that only honour expiry.
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..old.clone()
    }
}

#[cfg(test)]
mod tests;
