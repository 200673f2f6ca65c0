//! `cascade-guard uninstall`: removes everything cascade-guard put into the
//! cluster, so that nothing is left refused or stuck, and nothing leaves early:
//! its admission objects first (deletes are no longer checked), then its
//! finalizer from every object that carries it, whatever its kind. A live
//! object is let go at once; a deleting one is first made a foreground
//! cascade and let go once the garbage collector's `foregroundDeletion` holds
//! it, by the same state machine the controller runs: with the controller
//! stopped, a plain delete of a held object was let through and waits on
//! cascade-guard to convert it.

pub mod command;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, ListParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, ResourceExt};

use crate::Error;
use crate::cluster::convert::{Converter, Uncounted};
use crate::cluster::held;
use crate::cluster::kinds::ServedKinds;
use crate::cluster::{holds, unhold};
use crate::policy::ProtectedKind;
use crate::policy::names::FIELD_MANAGER;
use crate::policy::names::MANAGED_BY_SELECTOR;
use crate::policy::sibling::hold_policy::{HOLD_OBJECT_NAME, SIBLING_ORDER_LABEL};
use crate::policy::sibling::holds_record::HOLDS;
use k8s_openapi::api::core::v1::ConfigMap;

#[derive(Clone, Debug)]
pub struct UninstallOptions {
    /// Go on although a controller holds the leader Lease.
    pub force: bool,
    /// How long to wait for deleting objects to finish their cascades.
    pub timeout: Duration,
    /// The leader Lease's name, to tell whether a controller still runs.
    pub leader_election_id: String,
}

#[derive(Debug, Default)]
pub struct UninstallSummary {
    pub admission_objects: usize,
    /// Live objects let go.
    pub released: usize,
    /// Deleting objects made foreground cascades, then let go.
    pub cascaded: usize,
    /// Kinds still holding objects when the time ran out.
    pub left: Vec<String>,
    /// Kinds that could not be read: what they hold is not known.
    pub unreadable: Vec<String>,
    /// Objects sibling order held, let go.
    pub unheld: usize,
}

pub async fn uninstall(
    client: &Client,
    options: &UninstallOptions,
    progress: impl Fn(&str),
) -> Result<UninstallSummary, Error> {
    if let Some(holder) = running_controller(client, &options.leader_election_id).await? {
        if !options.force {
            return Err(Error::ControllerRunning { holder });
        }
        progress(&format!(
            "warning: {holder} holds the leader Lease: it puts back what this removes; going on (--force)"
        ));
    }
    if let Some(files) = static_protection_in_force(client).await {
        if !options.force {
            return Err(Error::StaticProtectionInForce { files });
        }
        progress(&format!(
            "warning: the API server serves cascade-guard's static manifests ({files}): its refusals stay until those files are deleted; going on (--force)"
        ));
    }
    let mut summary = UninstallSummary::default();
    // The compiled admission objects, then the sibling-order hold policy
    // (labelled apart, so the sync pass leaves it alone) and its label on
    // every object: what was held goes as its deleter goes on.
    for selector in [
        MANAGED_BY_SELECTOR.to_string(),
        format!("{SIBLING_ORDER_LABEL}=true"),
    ] {
        summary.admission_objects += delete_admission_objects(client, &selector).await?;
    }
    // Sibling order's ConfigMaps (what it held, how each tree stood),
    // wherever the controller ran: nothing reads them once its policies are
    // gone. What they held is let go: deleted where an owner is leaving (its
    // deleter was refused while it was held).
    let records: Api<ConfigMap> = Api::all(client.clone());
    let labelled = ListParams::default().labels(&format!("{SIBLING_ORDER_LABEL}=true"));
    let found = records
        .list_metadata(&labelled)
        .await
        .map_err(list("ConfigMaps"))?
        .items;
    let mut held = Vec::new();
    for c in found {
        let namespace = c.namespace().unwrap_or_default();
        if c.name_any() == HOLDS {
            held.extend(
                holds::read(client, &namespace)
                    .await
                    .map_err(list("what sibling order holds"))?
                    .into_iter()
                    .map(|(object, _)| object),
            );
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        delete_once_unguarded(&api, &c.name_any()).await?;
    }
    let kinds = ServedKinds::discover(client)
        .await
        .map_err(list("the cluster's kinds"))?;
    for object in &held {
        match unhold::let_go(client, &kinds, object).await {
            Ok(_) => summary.unheld += 1,
            Err(e) => progress(&format!("cannot let go of {object}: {e}")),
        }
    }
    if summary.unheld > 0 {
        progress(&format!(
            "let go of {} objects sibling order held",
            summary.unheld
        ));
    }
    let stripped = unhold::strip_old_labels(client, &kinds, |line| progress(line)).await;
    if stripped > 0 {
        progress(&format!("took the old hold label off {stripped} objects"));
    }

    // Every object that carries the finalizer, of any kind: one may hold it
    // from when its kind was Convert, whatever names the kind now.
    let scan = held::scan(client, held::Depth::Every)
        .await
        .map_err(list("custom resource kinds"))?;
    summary.unreadable = scan.unreadable.clone();
    let objects = scan.holding.iter().flat_map(|h| &h.objects);
    summary.cascaded = objects.clone().filter(|o| o.deleting).count();
    summary.released = objects.count() - summary.cascaded;
    if scan.holding.is_empty() {
        return Ok(summary);
    }
    progress(&format!(
        "letting go of {} live objects; making {} deleting objects foreground cascades first",
        summary.released, summary.cascaded
    ));
    let kinds: Vec<_> = scan.holding.into_iter().map(|h| h.kind).collect();
    summary.left = let_go_of_held(client, &kinds, options.timeout, &progress).await;
    Ok(summary)
}

/// Runs Convert on `kinds` until every object they hold is let go (a
/// deleting one once its foreground cascade holds it), or `timeout` runs
/// out; the kinds still holding objects then.
async fn let_go_of_held(
    client: &Client,
    kinds: &[ProtectedKind],
    timeout: Duration,
    progress: impl Fn(&str),
) -> Vec<String> {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some("uninstall".into()),
        },
    );
    let mut converter = Converter::for_uninstall(client.clone(), recorder, Arc::new(Uncounted));
    converter.update(BTreeMap::new(), kinds, true).await;
    let deadline = Instant::now() + timeout;
    let mut last_said = Instant::now();
    let left = loop {
        let draining = converter.draining();
        if draining.is_empty() || Instant::now() >= deadline {
            break draining;
        }
        if last_said.elapsed() >= Duration::from_secs(10) {
            last_said = Instant::now();
            progress(&format!("waiting for: {}", draining.join(", ")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    converter.shutdown().await;
    left
}

/// The holder of the leader Lease named `id` (in any namespace) while it is
/// valid: a controller that runs and would put back what uninstall removes.
async fn running_controller(client: &Client, id: &str) -> Result<Option<String>, Error> {
    let found = crate::cluster::running::find(client, id)
        .await
        .map_err(list("Leases"))?;
    Ok(found.into_iter().find(|r| r.live).map(|r| r.describe()))
}

/// Deletes the ValidatingAdmissionPolicyBindings, then the policies, that
/// `selector` picks; returns how many.
async fn delete_admission_objects(client: &Client, selector: &str) -> Result<usize, Error> {
    let params = ListParams::default().labels(selector);
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let mut count = 0;
    for b in bindings
        .list_metadata(&params)
        .await
        .map_err(list("bindings"))?
    {
        delete(&bindings, &b.name_any(), "ValidatingAdmissionPolicyBinding").await?;
        count += 1;
    }
    for p in policies
        .list_metadata(&params)
        .await
        .map_err(list("policies"))?
    {
        delete(&policies, &p.name_any(), "ValidatingAdmissionPolicy").await?;
        count += 1;
    }
    Ok(count)
}

fn list(what: &'static str) -> impl Fn(kube::Error) -> Error {
    move |source| Error::List { what, source }
}

async fn delete<K>(api: &Api<K>, name: &str, kind: &'static str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind,
            name: name.to_string(),
            source,
        }),
    }
}

/// Deletes one of sibling order's ConfigMaps, which its record guard guards:
/// the API server still checks a deleted policy for a second or so, so a
/// refusal by it is waited out (up to half a minute).
async fn delete_once_unguarded(api: &Api<ConfigMap>, name: &str) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s))
                if s.code == 403
                    && s.message.contains(HOLD_OBJECT_NAME)
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(source) => {
                return Err(Error::Delete {
                    kind: "ConfigMap",
                    name: name.to_string(),
                    source,
                });
            }
        }
    }
}

/// The static manifests files the API server reports it loaded, as
/// `writer:path` (None when none is, or it cannot be told): they stay in
/// force whatever is removed through the API, the hold policy included, which
/// would refuse taking the hold labels off.
async fn static_protection_in_force(client: &Client) -> Option<String> {
    use crate::cluster::static_protection::{read_server_report, records};
    use crate::policy::static_manifest::FILE_NAME;
    let records = records(client).await.ok()?;
    if records.is_empty() {
        return None;
    }
    let loaded = read_server_report(client).await.ok()?.loaded_hash?;
    let files: Vec<String> = records
        .iter()
        .filter(|r| r.hash.as_deref() == Some(loaded.as_str()))
        .map(|r| format!("{}:{}/{FILE_NAME}", r.writer, r.directory))
        .collect();
    (!files.is_empty()).then(|| files.join(", "))
}
