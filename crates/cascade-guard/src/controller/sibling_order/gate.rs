//! The gate's writes: how each root's tree stands, in the record
//! [`ORDERED_TREES`] of the controller's namespace, and the admission
//! policies that read it ([`compile_gate`]): a delete of a root whose tree is
//! not ordered is refused. The record is written before the policies,
//! which refuse every delete of a gated kind while it is missing.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};

use super::MANAGER;
use super::record::{MAX_BYTES, Record};
use super::uid::Uid;
use crate::policy::CompileSettings;
use crate::policy::sibling::gate::{GatedKind, ORDERED_TREES, compile_gate, gate_names};
use crate::policy::sibling::holds_record::HOLDS;
use marks::Marks;

/// How often the gate's policies are read back, to put back an edit.
const CHECK_EVERY: Duration = Duration::from_secs(10);

pub(super) struct Gate {
    client: Client,
    /// Write the policies (`--unordered-deletes=refuse`); else only the
    /// record, which `plan` reads, and no policy.
    enforce: bool,
    settings: CompileSettings,
    /// How each root's tree stands.
    marks: Marks,
    /// The record they are written to, encoded ([`Marks::encode`]).
    record: Record,
    /// What the record held at the start was taken into `marks`.
    taken_in: bool,
    /// The record's reads when the marks were last encoded into it, unless
    /// they changed since: encoding 100,000 marks every look was most of a
    /// look at rest.
    encoded: Option<u64>,
    /// The kinds the policies were last written for, and when.
    policies: Option<(Vec<GatedKind>, Instant)>,
    checked: Option<Instant>,
}

impl Gate {
    pub fn new(
        client: Client,
        namespace: String,
        enforce: bool,
        settings: CompileSettings,
    ) -> Self {
        Self {
            marks: Marks::default(),
            taken_in: false,
            record: Record::new(
                client.clone(),
                namespace,
                ORDERED_TREES,
                "how cascade-guard last read each tree it orders: a root's uid to the generation it was ordered at, or why it is not; the admission policies cascade-guard-sibling-order-roots-* read it",
            ),
            client,
            enforce,
            settings,
            encoded: None,
            policies: None,
            checked: None,
        }
    }

    /// Records how a root's tree stands after its read.
    pub fn mark(&mut self, root: &str, value: String, alone: bool) {
        if self.marks.mark(root, &value, alone) {
            self.encoded = None;
        }
    }

    /// Forgets a root that left (gone, or no longer ordered).
    pub fn forget(&mut self, root: &str) {
        if self.marks.forget(root) {
            self.encoded = None;
        }
    }

    /// Forgets the roots `keep` does not name (gone, or no longer ordered).
    /// Called only once every tree was read since the start: until then the
    /// marks a restart found stay in force.
    pub fn forget_others(&mut self, keep: impl Fn(&Uid) -> bool) {
        if self.marks.forget_others(keep) {
            self.encoded = None;
        }
    }

    /// Brings the record, then the policies, to what they should be.
    pub async fn write(&mut self, kinds: &[GatedKind], resync: Duration) {
        if !self.record.load().await {
            return;
        }
        // What a controller before this one wrote stays until this one reads
        // those trees again, or has read every tree.
        if !std::mem::replace(&mut self.taken_in, true) {
            self.marks.take_in(&self.record.wanted);
            self.encoded = None;
        }
        let reads = Some(self.record.reads());
        if self.encoded != reads {
            self.fit();
            self.record.wanted = self.marks.encode();
            self.encoded = reads;
        }
        if !self.record.write().await {
            return;
        }
        self.write_policies(kinds, resync).await;
    }

    /// Keeps the marks within what a record may hold: roots read alone go
    /// first (a composite with nothing composed is never gated), then any.
    /// A root left out is refused until there is room: never let through.
    fn fit(&mut self) {
        let left_out = self.marks.fit(MAX_BYTES);
        if left_out > 0 {
            tracing::warn!(
                left_out,
                "sibling order: more ordered trees than the record {ORDERED_TREES} can hold; the deletes of those left out are refused as not ordered"
            );
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
        let compiled = compile_gate(&kinds, &self.settings, self.record.namespace());
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

/// The gate's policies and both records, removed (`--sibling-order
/// off`): the policies first, which would refuse every delete of their
/// kinds without the record. The hold policy must be gone before (it
/// refuses a change of the records by anyone but a running controller).
pub(super) async fn remove_all(client: &Client, namespace: &str) {
    for name in gate_names() {
        remove(client, &name).await;
    }
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for name in [ORDERED_TREES, HOLDS] {
        match records.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(error = %e, %name, "sibling order: cannot remove its record")
            }
        }
    }
}

pub(super) mod marks;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_api_server::{Exchange, against, says};

    /// `--sibling-order off`: each gate policy's binding, then the policy,
    /// then both records, deleted; one gone already is no error, and
    /// nothing else is sent.
    #[tokio::test]
    async fn off_removes_every_gate_policy_then_both_records() {
        const VAP: &str = "/apis/admissionregistration.k8s.io/v1";
        let delete =
            |path: String| Exchange::delete(&format!("{path}?")).body_containing(json!({}));
        let mut script = Vec::new();
        for (i, name) in gate_names().into_iter().enumerate() {
            let binding = delete(format!("{VAP}/validatingadmissionpolicybindings/{name}"));
            let policy = delete(format!("{VAP}/validatingadmissionpolicies/{name}"));
            // The first pair gone already.
            if i == 0 {
                script.push(binding.fails(says::NOT_FOUND, "gone"));
                script.push(policy.fails(says::NOT_FOUND, "gone"));
            } else {
                script.push(binding.ok(json!({"kind": "Status", "status": "Success"})));
                script.push(policy.ok(json!({"kind": "Status", "status": "Success"})));
            }
        }
        for name in [ORDERED_TREES, HOLDS] {
            script.push(
                delete(format!("/api/v1/namespaces/home/configmaps/{name}"))
                    .ok(json!({"kind": "Status", "status": "Success"})),
            );
        }
        against(script, async |c| remove_all(&c, "home").await).await;
    }
}
