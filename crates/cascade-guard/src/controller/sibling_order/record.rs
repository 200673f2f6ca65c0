//! One ConfigMap of sibling order's, in the controller's namespace, kept as
//! a map the loop changes as it reads trees and writes once a look: what it
//! holds ([`HOLDS`](crate::policy::sibling::holds_record::HOLDS)) and which trees it ordered
//! ([`ORDERED_TREES`](crate::policy::sibling::gate::ORDERED_TREES)). Admission
//! policies read both as their parameter, so what is written is what is in
//! force; only the changed keys are sent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::MANAGER;
use crate::policy::names::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::policy::sibling::hold_policy::SIBLING_ORDER_LABEL;

/// What a ConfigMap may hold (1 MiB), less room for its metadata.
pub(super) const MAX_BYTES: usize = 900 * 1024;

pub(super) struct Record {
    client: Client,
    namespace: String,
    name: &'static str,
    /// What it is for, in words, on the record.
    what: &'static str,
    /// What the record holds, as last read or written; `None` until read.
    written: Option<BTreeMap<String, String>>,
    /// What it should hold.
    pub wanted: BTreeMap<String, String>,
    /// Said once: it cannot be read or written.
    warned: bool,
    /// How many times it was read: each read may add to `wanted`.
    reads: u64,
}

impl Record {
    pub fn new(client: Client, namespace: String, name: &'static str, what: &'static str) -> Self {
        Self {
            client,
            namespace,
            name,
            what,
            written: None,
            wanted: BTreeMap::new(),
            warned: false,
            reads: 0,
        }
    }

    /// Changes whenever a read may have added to `wanted`.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Reads the record once (again after a failed write): what a
    /// controller before this one wrote stays wanted unless the loop changed
    /// it since; it is made when missing. True when it is there.
    pub async fn load(&mut self) -> bool {
        if self.written.is_some() {
            return true;
        }
        let api = self.api();
        match api.get_opt(self.name).await {
            Ok(Some(live)) => {
                self.reads += 1;
                let live = live.data.unwrap_or_default();
                for (key, value) in &live {
                    self.wanted
                        .entry(key.clone())
                        .or_insert_with(|| value.clone());
                }
                self.written = Some(live);
                true
            }
            Ok(None) => self.create().await,
            Err(e) => {
                self.warn(&e);
                false
            }
        }
    }

    /// Sends what changed since the last write; true when the record now
    /// holds what is wanted.
    pub async fn write(&mut self) -> bool {
        if !self.load().await {
            return false;
        }
        let Some(written) = self.written.as_ref() else {
            return false;
        };
        let mut diff = serde_json::Map::new();
        for (key, value) in &self.wanted {
            if written.get(key) != Some(value) {
                diff.insert(key.clone(), json!(value));
            }
        }
        for key in written.keys().filter(|k| !self.wanted.contains_key(*k)) {
            diff.insert(key.clone(), serde_json::Value::Null);
        }
        if diff.is_empty() {
            return true;
        }
        let params = PatchParams {
            field_manager: Some(MANAGER.to_string()),
            ..PatchParams::default()
        };
        match self
            .api()
            .patch(self.name, &params, &Patch::Merge(json!({ "data": diff })))
            .await
        {
            Ok(_) => {
                self.written = Some(self.wanted.clone());
                true
            }
            // Deleted under it: made again, whole.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.written = None;
                self.create().await
            }
            Err(e) => {
                self.warn(&e);
                // Read again next time: what is there is not known.
                self.written = None;
                false
            }
        }
    }

    fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn create(&mut self) -> bool {
        let label = |k: &str, v: &str| (k.to_string(), v.to_string());
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                labels: Some(BTreeMap::from([
                    label(SIBLING_ORDER_LABEL, "true"),
                    label(MANAGED_BY_LABEL, MANAGED_BY_VALUE),
                ])),
                annotations: Some(BTreeMap::from([label("cascade-guard.dev/what", self.what)])),
                ..ObjectMeta::default()
            },
            data: Some(self.wanted.clone()),
            ..ConfigMap::default()
        };
        match self.api().create(&PostParams::default(), &object).await {
            Ok(_) => {
                self.written = Some(self.wanted.clone());
                true
            }
            // Made meanwhile (another controller): read it next time.
            Err(kube::Error::Api(s)) if s.code == 409 => false,
            Err(e) => {
                self.warn(&e);
                false
            }
        }
    }

    fn warn(&mut self, e: &kube::Error) {
        if !self.warned {
            self.warned = true;
            tracing::error!(error = %e, namespace = %self.namespace, name = self.name, "sibling order: cannot read or write its ConfigMap (cascade-guard needs create, and get and patch on it: the chart's Role <release>-sibling-order); until it can, the trees it orders are not ordered and nothing is held");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::fake_api_server::{Exchange, against, says};

    const PATH: &str = "/api/v1/namespaces/home/configmaps/cascade-guard-holds";
    const COLLECTION: &str = "/api/v1/namespaces/home/configmaps?";

    fn live(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cascade-guard-holds", "namespace": "home"}, "data": data})
    }

    fn record(client: Client) -> Record {
        Record::new(
            client,
            "home".into(),
            "cascade-guard-holds",
            "what it holds",
        )
    }

    /// Read once; then only what changed is sent, as a merge patch (a key
    /// gone is null); a write that changes nothing sends nothing.
    #[tokio::test]
    async fn a_record_is_read_once_then_patched_with_what_changed() {
        let patch = format!("{PATH}?&fieldManager={MANAGER}");
        let script = vec![
            Exchange::get(PATH).ok(live(json!({"kept": "1", "gone": "2"}))),
            Exchange::patch(&patch)
                .header("content-type", "application/merge-patch+json")
                .body(json!({"data": {"kept": "3", "gone": null}}))
                .ok(live(json!({"kept": "3"}))),
        ];
        let written = against(script, async |c| {
            let mut r = record(c);
            assert!(r.load().await);
            // What it held at the start stays wanted until changed.
            assert_eq!(r.wanted.get("gone").map(String::as_str), Some("2"));
            r.wanted = BTreeMap::from([("kept".to_string(), "3".to_string())]);
            let first = r.write().await;
            let again = r.write().await;
            (first, again)
        })
        .await;
        assert_eq!(written, (true, true));
    }

    /// Missing: made, labelled as cascade-guard's; deleted under it: made
    /// again, whole; made meanwhile by another: read next time.
    #[tokio::test]
    async fn a_missing_record_is_made_and_one_deleted_under_it_made_again() {
        let made = || {
            Exchange::post(COLLECTION)
                .body_containing(json!({
                    "metadata": {"name": "cascade-guard-holds", "labels": {
                        "app.kubernetes.io/managed-by": "cascade-guard"}},
                    "data": {"k": "v"},
                }))
                .created()
        };
        let patch = format!("{PATH}?&fieldManager={MANAGER}");
        let script = vec![
            Exchange::get(PATH).fails(says::NOT_FOUND, "not found"),
            made(),
            Exchange::patch(&patch)
                .body(json!({"data": {"k": "v"}}))
                .fails(says::NOT_FOUND, "deleted"),
            made(),
        ];
        let outcome = against(script, async |c| {
            let mut r = record(c);
            r.wanted = BTreeMap::from([("k".to_string(), "v".to_string())]);
            let made = r.load().await;
            r.wanted = BTreeMap::from([("k".to_string(), "v".to_string())]);
            r.written = Some(BTreeMap::new());
            let again = r.write().await;
            (made, again)
        })
        .await;
        assert_eq!(outcome, (true, true));
        let raced = against(
            vec![
                Exchange::get(PATH).fails(says::NOT_FOUND, "not found"),
                Exchange::post(COLLECTION)
                    .body_containing(json!({"metadata": {"name": "cascade-guard-holds"}}))
                    .fails(says::CONFLICT, "exists"),
            ],
            async |c| record(c).load().await,
        )
        .await;
        assert!(!raced, "made by another: not known to hold what is wanted");
    }
}
