//! Reading the API server's audit log, to assert what clients and controllers
//! actually sent and who the API server (and so admission) saw sending it.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub verb: String,
    pub stage: String,
    pub user: User,
    #[serde(default)]
    pub impersonated_user: Option<User>,
    #[serde(default)]
    pub object_ref: Option<AuditObjectRef>,
    /// For deletes: the DeleteOptions as sent.
    #[serde(default)]
    pub request_object: Option<Value>,
    #[serde(default)]
    pub response_status: Option<Value>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct User {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// The object an audited request is for (the event's `objectRef`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
}

impl Event {
    /// The user the request acted as: the impersonated one if any. This is the
    /// user that authorization and admission see.
    pub fn effective_username(&self) -> &str {
        self.impersonated_user
            .as_ref()
            .map(|u| u.username.as_str())
            .unwrap_or(&self.user.username)
    }

    /// The `propagationPolicy` the client sent, if any.
    pub fn propagation_policy(&self) -> Option<&str> {
        self.request_object
            .as_ref()?
            .get("propagationPolicy")?
            .as_str()
    }

    /// A dry run (`dryRun: [All]` in the DeleteOptions): nothing was
    /// deleted. Tests probe whether a hold is in force with one.
    pub fn dry_run(&self) -> bool {
        self.request_object
            .as_ref()
            .and_then(|o| o.get("dryRun"))
            .and_then(|d| d.as_array())
            .is_some_and(|d| !d.is_empty())
    }

    pub fn response_code(&self) -> Option<i64> {
        self.response_status.as_ref()?.get("code")?.as_i64()
    }

    pub fn is_about(&self, resource: &str, namespace: &str, name: &str) -> bool {
        self.object_ref
            .as_ref()
            .is_some_and(|r| r.resource == resource && r.namespace == namespace && r.name == name)
    }
}

/// Every complete (`ResponseComplete`) delete and deletecollection in the
/// log, with the DeleteOptions sent; lines that are not events (a partly
/// written last line) are skipped. A log that cannot be read is an error,
/// never a log without events: "nothing was refused" must not pass on it.
pub fn read(path: &Path) -> std::io::Result<Vec<Event>> {
    Ok(complete(path)?
        .filter(|e| e.verb == "delete" || e.verb == "deletecollection")
        .collect())
}

/// Every complete update and patch in the log (metadata only: who, what,
/// the response's status), Leases and Events left out.
pub fn read_writes(path: &Path) -> std::io::Result<Vec<Event>> {
    Ok(complete(path)?
        .filter(|e| e.verb == "update" || e.verb == "patch")
        .collect())
}

fn complete(path: &Path) -> std::io::Result<impl Iterator<Item = Event>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("audit log {}: {e}", path.display())))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<Event>(line).ok())
        .filter(|e| e.stage == "ResponseComplete")
        .collect::<Vec<_>>()
        .into_iter())
}

impl Event {
    /// Refused by one of cascade-guard's admission policies: the response
    /// names a ValidatingAdmissionPolicy of cascade-guard's.
    pub fn refused_by_cascade_guard(&self) -> bool {
        self.response_code().is_some_and(|c| c >= 400)
            && self
                .response_status
                .as_ref()
                .and_then(|s| s.get("message"))
                .and_then(Value::as_str)
                .is_some_and(|m| m.contains("ValidatingAdmissionPolicy 'cascade-guard"))
    }
}
