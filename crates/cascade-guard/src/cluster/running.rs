//! What a running controller says of itself, for `status` and `uninstall`:
//! found by its Lease (by name, in any namespace). The leader writes the
//! settings it compiles with on the Lease it holds; a controller started with
//! `--no-leader-election` keeps the same Lease renewed without contending,
//! so that it can be found as well.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::policy::{CompileSettings, Mode};

/// The settings the leader compiles with (JSON).
pub const SETTINGS_ANNOTATION: &str = "cascade-guard.dev/controller-settings";
/// `off` on the Lease of a controller started with `--no-leader-election`.
pub const LEADER_ELECTION_ANNOTATION: &str = "cascade-guard.dev/leader-election";

/// What changes what the controller compiles, as it publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerSettings {
    pub xrd_default_mode: Mode,
    pub gc_service_account_user: String,
    pub gc_controller_manager_user: String,
    pub crossplane_user: String,
    pub controller_user: String,
    pub break_glass_needs_permission: bool,
    pub sibling_order: bool,
}

impl ControllerSettings {
    pub fn new(xrd_default_mode: Mode, compile: &CompileSettings, sibling_order: bool) -> Self {
        Self {
            xrd_default_mode,
            gc_service_account_user: compile.gc_service_account_user.clone(),
            gc_controller_manager_user: compile.gc_controller_manager_user.clone(),
            crossplane_user: compile.crossplane_user.clone(),
            controller_user: compile.controller_user.clone(),
            break_glass_needs_permission: compile.break_glass_needs_permission,
            sibling_order,
        }
    }

    pub fn compile(&self) -> CompileSettings {
        CompileSettings {
            gc_service_account_user: self.gc_service_account_user.clone(),
            gc_controller_manager_user: self.gc_controller_manager_user.clone(),
            crossplane_user: self.crossplane_user.clone(),
            controller_user: self.controller_user.clone(),
            break_glass_needs_permission: self.break_glass_needs_permission,
            set_name: None,
        }
    }

    /// The annotations the Lease carries.
    pub fn annotations(&self, leader_election: bool) -> std::collections::BTreeMap<String, String> {
        let mut annotations = std::collections::BTreeMap::new();
        // A struct of strings, a mode and booleans always serialises.
        if let Ok(json) = serde_json::to_string(self) {
            annotations.insert(SETTINGS_ANNOTATION.to_string(), json);
        }
        annotations.insert(
            LEADER_ELECTION_ANNOTATION.to_string(),
            if leader_election { "on" } else { "off" }.to_string(),
        );
        annotations
    }
}

/// One controller Lease, read.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    pub namespace: String,
    pub lease: String,
    /// Who holds it (the leader's pod name); empty when nobody does.
    pub holder: String,
    pub renewed_seconds_ago: u64,
    /// Held and renewed within its duration: a controller runs.
    pub live: bool,
    pub leader_election: bool,
    /// What it compiles with; None for a controller from before it published
    /// them, or an annotation that cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<ControllerSettings>,
}

impl Running {
    /// `controller X (Lease ns/name, renewed Ns ago)`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "controller {} (Lease {}/{}, renewed {}s ago{})",
            self.holder,
            self.namespace,
            self.lease,
            self.renewed_seconds_ago,
            if self.leader_election {
                ""
            } else {
                ", leader election off"
            }
        )
    }
}

/// Reads a Lease (pure).
pub fn read(lease: &Lease, now: Timestamp) -> Running {
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let renewed_seconds_ago = spec
        .renew_time
        .as_ref()
        .map(|t| now.duration_since(t.0).as_secs().max(0).unsigned_abs())
        .unwrap_or(u64::MAX);
    let valid = u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(0);
    let annotations = lease.annotations();
    Running {
        namespace: lease.namespace().unwrap_or_default(),
        lease: lease.name_any(),
        live: !holder.is_empty() && renewed_seconds_ago <= valid,
        holder,
        renewed_seconds_ago,
        leader_election: annotations
            .get(LEADER_ELECTION_ANNOTATION)
            .is_none_or(|v| v != "off"),
        settings: annotations
            .get(SETTINGS_ANNOTATION)
            .and_then(|json| serde_json::from_str(json).ok()),
    }
}

/// Every Lease named `id`, in any namespace, read; live ones first.
pub async fn find(client: &Client, id: &str) -> Result<Vec<Running>, kube::Error> {
    let leases: Api<Lease> = Api::all(client.clone());
    let found = leases
        .list(&ListParams::default().fields(&format!("metadata.name={id}")))
        .await?;
    let now = Timestamp::now();
    let mut running: Vec<Running> = found.items.iter().map(|l| read(l, now)).collect();
    running.sort_by_key(|r| (!r.live, r.renewed_seconds_ago));
    Ok(running)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;

    fn lease(holder: Option<&str>, renewed_ago: i64, annotations: &[(&str, &str)]) -> Lease {
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
        Lease {
            metadata: ObjectMeta {
                name: Some("cascade-guard".into()),
                namespace: Some("cascade-guard-system".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    now - k8s_openapi::jiff::SignedDuration::from_secs(renewed_ago),
                )),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_says_who_runs_with_what() {
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
        let settings = ControllerSettings::new(Mode::Convert, &CompileSettings::default(), true);
        let json = serde_json::to_string(&settings).unwrap();
        let live = read(
            &lease(Some("pod-a"), 3, &[(SETTINGS_ANNOTATION, &json)]),
            now,
        );
        assert!(live.live);
        assert!(live.leader_election);
        assert_eq!(live.settings, Some(settings.clone()));
        assert_eq!(live.settings.unwrap().compile(), CompileSettings::default());

        let stale = read(&lease(Some("pod-a"), 60, &[]), now);
        assert!(!stale.live, "not renewed within its duration");
        assert_eq!(stale.settings, None);

        let released = read(&lease(None, 1, &[]), now);
        assert!(!released.live, "nobody holds it");

        let solo = read(
            &lease(
                Some("pod-b"),
                1,
                &[
                    (LEADER_ELECTION_ANNOTATION, "off"),
                    (SETTINGS_ANNOTATION, "{bad"),
                ],
            ),
            now,
        );
        assert!(solo.live && !solo.leader_election);
        assert_eq!(
            solo.settings, None,
            "an unreadable annotation is no settings"
        );
        assert!(solo.describe().contains("leader election off"));
    }
}
