//! The gate's writes: how each root's tree stands, in the ConfigMap
//! [`ORDERED_TREES`] of the controller's namespace, and the admission
//! policies that read it ([`compile_gate`]): a delete of a root whose tree is
//! not ordered is refused. The ConfigMap is written before the policies,
//! which refuse every delete of a gated kind while it is missing.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::MANAGER;
use crate::policy::CompileSettings;
use crate::policy::hold::SIBLING_ORDER_LABEL;
use crate::policy::order_gate::{
    GatedKind, ORDERED_TREES, ORDERED_TREES_MAX_BYTES, compile_gate, gate_names,
};

/// How often the gate's policies are read back, to put back an edit.
const CHECK_EVERY: Duration = Duration::from_secs(10);

pub(super) struct Gate {
    client: Client,
    namespace: String,
    /// Write the policies (`--unordered-deletes=refuse`); else only the
    /// ConfigMap, which `plan` reads, and no policy.
    enforce: bool,
    settings: CompileSettings,
    /// What the ConfigMap holds, as last read or written; `None` until it
    /// was read once.
    written: Option<BTreeMap<String, String>>,
    /// What it should hold: a root's uid to its `TreeOrder` value.
    marks: BTreeMap<String, String>,
    /// Roots read alone (nothing composed or referenced): left out first
    /// when the ConfigMap would grow past its size.
    alone: HashSet<String>,
    /// The kinds the policies were last written for, and when.
    policies: Option<(Vec<GatedKind>, Instant)>,
    checked: Option<Instant>,
    /// Said once: the ConfigMap cannot be written.
    warned: bool,
}

impl Gate {
    pub fn new(
        client: Client,
        namespace: String,
        enforce: bool,
        settings: CompileSettings,
    ) -> Self {
        Self {
            client,
            namespace,
            enforce,
            settings,
            written: None,
            marks: BTreeMap::new(),
            alone: HashSet::new(),
            policies: None,
            checked: None,
            warned: false,
        }
    }

    /// Records how a root's tree stands after its read.
    pub fn mark(&mut self, root: &str, value: String, alone: bool) {
        if alone {
            self.alone.insert(root.to_string());
        } else {
            self.alone.remove(root);
        }
        self.marks.insert(root.to_string(), value);
    }

    /// Forgets the roots `keep` does not name (gone, or no longer ordered).
    /// Called only once every tree was read since the start: until then the
    /// marks a restart found stay in force.
    pub fn forget_others(&mut self, keep: impl Fn(&str) -> bool) {
        self.marks.retain(|uid, _| keep(uid));
        self.alone.retain(|uid| keep(uid));
    }

    /// Brings the ConfigMap, then the policies, to what they should be.
    pub async fn write(&mut self, kinds: &[GatedKind], resync: Duration) {
        if !self.write_marks().await {
            return;
        }
        self.write_policies(kinds, resync).await;
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// True once the ConfigMap exists with what it should hold.
    async fn write_marks(&mut self) -> bool {
        let api = self.configmaps();
        if self.written.is_none() {
            match api.get_opt(ORDERED_TREES).await {
                Ok(live) => {
                    let existed = live.is_some();
                    let live = live.and_then(|c| c.data).unwrap_or_default();
                    // What a controller before this one wrote stays until
                    // this one has read every tree.
                    for (uid, value) in &live {
                        self.marks
                            .entry(uid.clone())
                            .or_insert_with(|| value.clone());
                    }
                    if !existed && !self.create(&api).await {
                        return false;
                    }
                    self.written = Some(if existed { live } else { self.marks.clone() });
                }
                Err(e) => {
                    self.warn(&e);
                    return false;
                }
            }
        }
        self.fit();
        let Some(written) = self.written.as_ref() else {
            return false;
        };
        let mut diff = serde_json::Map::new();
        for (uid, value) in &self.marks {
            if written.get(uid) != Some(value) {
                diff.insert(uid.clone(), json!(value));
            }
        }
        for uid in written.keys().filter(|uid| !self.marks.contains_key(*uid)) {
            diff.insert(uid.clone(), serde_json::Value::Null);
        }
        if diff.is_empty() {
            return true;
        }
        let params = PatchParams {
            field_manager: Some(MANAGER.to_string()),
            ..PatchParams::default()
        };
        match api
            .patch(
                ORDERED_TREES,
                &params,
                &Patch::Merge(json!({ "data": diff })),
            )
            .await
        {
            Ok(_) => {
                self.written = Some(self.marks.clone());
                true
            }
            // Deleted under it: made again, whole.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let created = self.create(&api).await;
                if created {
                    self.written = Some(self.marks.clone());
                }
                created
            }
            Err(e) => {
                self.warn(&e);
                // Read again next time: what is there is not known.
                self.written = None;
                false
            }
        }
    }

    async fn create(&mut self, api: &Api<ConfigMap>) -> bool {
        let object: ConfigMap = match serde_json::from_value(json!({
            "metadata": {
                "name": ORDERED_TREES,
                "labels": { SIBLING_ORDER_LABEL: "true", "app.kubernetes.io/managed-by": "cascade-guard" },
                "annotations": { "cascade-guard.dev/what": "how cascade-guard last read each tree it orders: a root's uid to the generation it was ordered at, or why it is not; the admission policies cascade-guard-sibling-order-roots-* read it" },
            },
            "data": self.marks,
        })) {
            Ok(object) => object,
            Err(e) => {
                tracing::error!(error = %e, "sibling order: cannot build the ordered-trees ConfigMap");
                return false;
            }
        };
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Made meanwhile (another controller): read it next time.
                self.written = None;
                false
            }
            Err(e) => {
                self.warn(&e);
                false
            }
        }
    }

    /// Keeps the marks within what a ConfigMap may hold: roots read alone go
    /// first (a composite with nothing composed is never gated), then any.
    /// A root left out is refused until there is room: never let through.
    fn fit(&mut self) {
        let size = |marks: &BTreeMap<String, String>| -> usize {
            marks.iter().map(|(k, v)| k.len() + v.len() + 8).sum()
        };
        let mut total = size(&self.marks);
        if total <= ORDERED_TREES_MAX_BYTES {
            return;
        }
        let before = self.marks.len();
        let alone: Vec<String> = self.alone.iter().cloned().collect();
        for uid in alone {
            if total <= ORDERED_TREES_MAX_BYTES {
                break;
            }
            if let Some(v) = self.marks.remove(&uid) {
                total -= uid.len() + v.len() + 8;
            }
        }
        while total > ORDERED_TREES_MAX_BYTES {
            let Some((uid, v)) = self.marks.pop_last() else {
                break;
            };
            total -= uid.len() + v.len() + 8;
        }
        tracing::warn!(
            left_out = before - self.marks.len(),
            "sibling order: more ordered trees than the ConfigMap {ORDERED_TREES} can hold; the deletes of those left out are refused as not ordered"
        );
    }

    fn warn(&mut self, e: &kube::Error) {
        if !self.warned {
            self.warned = true;
            tracing::error!(error = %e, namespace = %self.namespace, "sibling order: cannot read or write the ConfigMap {ORDERED_TREES}; deletes of trees it does not name as ordered are refused (cascade-guard needs get, create and patch on it: the chart's Role)");
        }
    }

    async fn write_policies(&mut self, kinds: &[GatedKind], resync: Duration) {
        // Not enforced: none, and none left from when it was.
        let mut kinds = if self.enforce {
            kinds.to_vec()
        } else {
            Vec::new()
        };
        kinds.sort();
        kinds.dedup();
        let changed = self
            .policies
            .as_ref()
            .is_none_or(|(k, at)| *k != kinds || at.elapsed() > resync);
        let check = self.checked.is_none_or(|at| at.elapsed() > CHECK_EVERY);
        if !changed && !check {
            return;
        }
        self.checked = Some(Instant::now());
        let compiled = compile_gate(&kinds, &self.settings, &self.namespace);
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.client.clone());
        let apply = PatchParams::apply(MANAGER).force();
        let mut ok = true;
        for c in &compiled {
            let name = c.policy.metadata.name.clone().unwrap_or_default();
            if !changed
                && !super::drifted(&policies, &name, &c.policy).await
                && !super::drifted(&bindings, &name, &c.binding).await
            {
                continue;
            }
            // The policy first: a binding to a missing policy is an error in
            // the API server's log, not a refusal.
            let written = policies
                .patch(&name, &apply, &Patch::Apply(&c.policy))
                .await
                .and(
                    bindings
                        .patch(&name, &apply, &Patch::Apply(&c.binding))
                        .await,
                );
            if let Err(e) = written {
                ok = false;
                tracing::error!(error = %e, %name, "sibling order: cannot write the gate policy; deletes of unordered trees of these kinds go through");
            }
        }
        if changed {
            let kept: HashSet<String> = compiled
                .iter()
                .filter_map(|c| c.policy.metadata.name.clone())
                .collect();
            for name in gate_names().into_iter().filter(|n| !kept.contains(n)) {
                remove(&self.client, &name).await;
            }
        }
        if ok && changed {
            self.policies = Some((kinds, Instant::now()));
        }
    }
}

/// Deletes one of sibling order's policies and its binding, if there.
pub(super) async fn remove(client: &Client, name: &str) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    for r in [
        bindings
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
        policies
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
    ] {
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(error = %e, %name, "sibling order: cannot remove a gate policy")
            }
        }
    }
}

/// Everything sibling order put in the cluster's admission and its
/// ConfigMap, removed (`--sibling-order off`): the gate's policies first,
/// which would refuse every delete of their kinds without the ConfigMap.
pub(super) async fn remove_all(client: &Client, namespace: &str) {
    for name in gate_names() {
        remove(client, &name).await;
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match configmaps
        .delete(ORDERED_TREES, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(error = %e, "sibling order: cannot remove the ConfigMap {ORDERED_TREES}")
        }
    }
}
