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
use super::schedule::CHECK_EVERY;
use super::uid::Uid;
use crate::policy::CompileSettings;
use crate::policy::sibling::gate::{GatedKind, ORDERED_TREES, compile_gate, gate_names};
use crate::policy::sibling::holds_record::HOLDS;
use marks::Marks;

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
                && !super::drifted_pair((&policies, &c.policy), (&bindings, &c.binding), &name)
                    .await
            {
                continue;
            }
            // The policy first, and its binding only once it is written: a
            // binding to a missing policy is an error in the API server's
            // log, not a refusal.
            let written = async {
                policies
                    .patch(&name, &apply, &Patch::Apply(&c.policy))
                    .await?;
                bindings
                    .patch(&name, &apply, &Patch::Apply(&c.binding))
                    .await
            }
            .await;
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
    use serde_json::{Value, json};

    use super::*;
    use crate::fake_api_server::{BINDINGS, Exchange, POLICIES, against, says};
    use crate::policy::Shape;
    use crate::policy::admission::Compiled;
    use crate::policy::sibling::gate::gate_name;

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

    const RECORD: &str = "/api/v1/namespaces/home/configmaps/cascade-guard-ordered-trees";

    fn gated(plural: &str, shape: Shape) -> GatedKind {
        GatedKind {
            group: "example.org".into(),
            plural: plural.into(),
            shape,
        }
    }

    fn gate(client: Client, enforce: bool) -> Gate {
        Gate::new(client, "home".into(), enforce, CompileSettings::default())
    }

    /// The record as the API server gives it.
    fn record(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": ORDERED_TREES, "namespace": "home"}, "data": data})
    }

    /// The merge patch that sends what changed in the record.
    fn record_patch(data: Value) -> Exchange {
        Exchange::patch(&format!("{RECORD}?&fieldManager=cascade-guard"))
            .header("content-type", "application/merge-patch+json")
            .body(json!({ "data": data }))
    }

    /// Each shape's policy, then its binding, applied for `kinds`.
    fn applies(kinds: &[GatedKind]) -> Vec<Exchange> {
        compile_gate(kinds, &CompileSettings::default(), "home")
            .into_iter()
            .flat_map(|c| {
                let name = c.policy.metadata.name.clone().unwrap_or_default();
                [
                    Exchange::apply(&format!("{POLICIES}/{name}"), &c.policy).echoes(),
                    Exchange::apply(&format!("{BINDINGS}/{name}"), &c.binding).echoes(),
                ]
            })
            .collect()
    }

    /// The binding, then the policy, of the gate's pair for `shape`
    /// deleted (gone already: 404).
    fn removed(shape: Shape) -> Vec<Exchange> {
        let name = gate_name(shape);
        [BINDINGS, POLICIES]
            .into_iter()
            .map(|collection| {
                Exchange::delete(&format!("{collection}/{name}?"))
                    .body(json!({}))
                    .fails(says::NOT_FOUND, "gone")
            })
            .collect()
    }

    /// A write: the record read, what changed in it sent, then the pair of
    /// each shape gated applied (forced, as cascade-guard), and the pairs of
    /// the other shapes removed; a write soon after with nothing changed
    /// sends nothing.
    #[tokio::test]
    async fn a_write_sends_the_record_then_applies_each_shapes_pair() {
        let kinds = vec![gated("xdatabases", Shape::CompositeResource)];
        let mut script = vec![
            Exchange::get(RECORD).ok(record(json!({}))),
            record_patch(json!({"ordered": " u1=3 ", "u2": "cannot order: why"}))
                .ok(record(json!({}))),
        ];
        script.extend(applies(&kinds));
        script.extend(removed(Shape::Claim));
        script.extend(removed(Shape::Other));
        against(script, async |c| {
            let mut g = gate(c, true);
            g.mark("u1", "3".into(), false);
            g.mark("u2", "cannot order: why".into(), false);
            g.write(&kinds, Duration::from_secs(3600)).await;
            assert_eq!(g.policies.as_ref().map(|(k, _)| k), Some(&kinds));
            g.write(&kinds, Duration::from_secs(3600)).await;
        })
        .await;
    }

    /// The record first: one that cannot be read or written writes no
    /// policy (they would refuse every delete of a gated kind without it).
    #[tokio::test]
    async fn no_policy_is_written_before_the_record() {
        let kinds = vec![gated("xdatabases", Shape::CompositeResource)];
        let unreadable = vec![Exchange::get(RECORD).fails(says::FORBIDDEN, "no get")];
        let unwritable = vec![
            Exchange::get(RECORD).ok(record(json!({}))),
            record_patch(json!({"ordered": " u1=3 "})).fails(says::INTERNAL, "etcd"),
        ];
        for script in [unreadable, unwritable] {
            against(script, async |c| {
                let mut g = gate(c, true);
                g.mark("u1", "3".into(), false);
                g.write(&kinds, Duration::from_secs(3600)).await;
                assert!(g.policies.is_none());
            })
            .await;
        }
    }

    /// A pair that could not be applied is applied again at the next
    /// write, however soon.
    #[tokio::test]
    async fn a_failed_apply_is_tried_again_at_the_next_write() {
        let kinds = vec![gated("xclaims", Shape::Claim)];
        let mut script = vec![Exchange::get(RECORD).ok(record(json!({"ordered": " "})))];
        let mut first = applies(&kinds);
        let binding = first.pop().expect("a binding");
        first.push(binding.fails(says::INTERNAL, "etcd"));
        script.extend(first);
        script.extend(removed(Shape::CompositeResource));
        script.extend(removed(Shape::Other));
        script.extend(applies(&kinds));
        script.extend(removed(Shape::CompositeResource));
        script.extend(removed(Shape::Other));
        against(script, async |c| {
            let mut g = gate(c, true);
            g.write(&kinds, Duration::from_secs(3600)).await;
            assert!(g.policies.is_none());
            g.write(&kinds, Duration::from_secs(3600)).await;
            assert!(g.policies.is_some());
        })
        .await;
    }

    /// A policy that could not be applied gets no binding after it.
    #[tokio::test]
    async fn a_failed_policy_apply_sends_no_binding() {
        let kinds = vec![gated("xclaims", Shape::Claim)];
        let mut script = vec![Exchange::get(RECORD).ok(record(json!({"ordered": " "})))];
        let mut pair = applies(&kinds);
        pair.truncate(1);
        let policy = pair.pop().expect("a policy");
        script.push(policy.fails(says::INTERNAL, "etcd"));
        script.extend(removed(Shape::CompositeResource));
        script.extend(removed(Shape::Other));
        against(script, async |c| {
            let mut g = gate(c, true);
            g.write(&kinds, Duration::from_secs(3600)).await;
            assert!(g.policies.is_none());
        })
        .await;
    }

    /// Not enforced (`--unordered-deletes` not refuse): the record only,
    /// and every gate pair removed, none applied.
    #[tokio::test]
    async fn not_enforced_writes_the_record_and_removes_every_pair() {
        let kinds = vec![gated("xdatabases", Shape::CompositeResource)];
        let mut script = vec![
            Exchange::get(RECORD).ok(record(json!({}))),
            record_patch(json!({"ordered": " u1=3 "})).ok(record(json!({}))),
        ];
        for shape in [Shape::CompositeResource, Shape::Claim, Shape::Other] {
            script.extend(removed(shape));
        }
        against(script, async |c| {
            let mut g = gate(c, false);
            g.mark("u1", "3".into(), false);
            g.write(&kinds, Duration::from_secs(3600)).await;
        })
        .await;
    }

    /// Every while, each pair is read back: one as written is left, one
    /// edited is applied again, policy and binding.
    #[tokio::test]
    async fn an_edited_pair_is_put_back_when_read_back() {
        let kinds = vec![
            gated("xdatabases", Shape::CompositeResource),
            gated("xclaims", Shape::Claim),
        ];
        let compiled = compile_gate(&kinds, &CompileSettings::default(), "home");
        let (composites, claims) = (&compiled[0], &compiled[1]);
        let name = |c: &Compiled| c.policy.metadata.name.clone().unwrap_or_default();
        let mut edited = serde_json::to_value(&claims.binding).expect("serialises");
        edited["spec"]["validationActions"] = json!(["Warn"]);
        let mut script = vec![Exchange::get(RECORD).ok(record(json!({"ordered": " "})))];
        script.extend(applies(&kinds));
        script.extend(removed(Shape::Other));
        script.extend([
            Exchange::get(&format!("{POLICIES}/{}", name(composites)))
                .ok(serde_json::to_value(&composites.policy).expect("serialises")),
            Exchange::get(&format!("{BINDINGS}/{}", name(composites)))
                .ok(serde_json::to_value(&composites.binding).expect("serialises")),
            Exchange::get(&format!("{POLICIES}/{}", name(claims)))
                .ok(serde_json::to_value(&claims.policy).expect("serialises")),
            Exchange::get(&format!("{BINDINGS}/{}", name(claims))).ok(edited),
            Exchange::apply(&format!("{POLICIES}/{}", name(claims)), &claims.policy).echoes(),
            Exchange::apply(&format!("{BINDINGS}/{}", name(claims)), &claims.binding).echoes(),
        ]);
        against(script, async |c| {
            let mut g = gate(c, true);
            g.write(&kinds, Duration::from_secs(3600)).await;
            g.checked = Instant::now().checked_sub(CHECK_EVERY * 2);
            g.write(&kinds, Duration::from_secs(3600)).await;
        })
        .await;
    }
}
