//! What sibling order holds, kept in its record
//! ([`HOLDS`](crate::policy::sibling::holds_record::HOLDS)), and the hold policy that reads it
//! ([`compile_hold`]). The loop changes the entries as it reads trees and
//! writes them once a look; the record is made, and entries an older
//! release kept as labels are taken in, before the policy is written, so that
//! nothing held loses its hold across a start or an upgrade.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use super::MANAGER;
use super::entries::Entries;
use super::record::{MAX_BYTES, Record};
use super::schedule::CHECK_EVERY;
use crate::cluster::kinds::ServedKinds;
use crate::cluster::{holds, unhold};
use crate::policy::CompileSettings;
use crate::policy::sibling::hold::Held;
use crate::policy::sibling::hold_policy::{
    HOLD_OBJECT_NAME, HeldKind, RECORD_GUARD_NAME, compile_hold, compile_record_guard,
};
use crate::policy::sibling::holds_record::{
    HELD_FOR_ANNOTATION, HOLD_LABEL, HOLDS, HoldEntry, decode_holds, encode_holds, hold_key,
    parse_hold_key,
};
use crate::policy::sibling::object::ObjectRef;

/// How long after the hold policy first names a kind its holds count as
/// made: the API server rebuilds its admission policies at most once a
/// second after its informer sees a change (k8s.io/apiserver's generic
/// policy source), and nothing in the API tells when it has.
const LOADED_AFTER: Duration = Duration::from_secs(3);

/// The longest wait, of kinds named this long ago, until each is loaded.
fn loading(named_since: impl Iterator<Item = Duration>) -> Duration {
    named_since
        .map(|since| LOADED_AFTER.saturating_sub(since))
        .max()
        .unwrap_or_default()
}

pub(super) struct Holds {
    client: Client,
    settings: CompileSettings,
    /// What is held.
    entries: Entries,
    /// The record they are written to, encoded ([`encode_holds`]).
    record: Record,
    /// What the record held at the start was taken into `entries`.
    taken_in: bool,
    /// When the policy was last written whole.
    policy_written: Option<Instant>,
    /// When the policies were last read back for an edit.
    checked: Option<Instant>,
    /// The kinds the policy in the cluster names, each with when it first
    /// named it; only DELETEs of these kinds reach the policy.
    named: BTreeMap<HeldKind, Instant>,
    /// The entries' version, and the record's reads, when the entries were
    /// last encoded into it.
    encoded: Option<(u64, u64)>,
    /// The old labels were taken in (once, at the start).
    migrated: bool,
    /// And are to be taken off, once the new policy holds what they held.
    strip_old: bool,
}

impl Holds {
    pub fn new(client: Client, namespace: String, settings: CompileSettings) -> Self {
        Self {
            entries: Entries::default(),
            taken_in: false,
            record: Record::new(
                client.clone(),
                namespace,
                HOLDS,
                "what cascade-guard holds for sibling order: an object's Kind_group_namespace_name to the uid of the root that holds it and what it waits for; the admission policy cascade-guard-sibling-order reads it",
            ),
            client,
            settings,
            policy_written: None,
            checked: None,
            named: BTreeMap::new(),
            encoded: None,
            migrated: false,
            strip_old: false,
        }
    }

    /// The record and the policy in place (made, written): holds can be
    /// made and kept.
    pub fn in_place(&self) -> bool {
        self.policy_written.is_some()
    }

    /// Whether a hold on `object` is in force: its kind named by the hold
    /// policy long enough for the API server to have loaded it; why not.
    pub fn in_force(&self, object: &ObjectRef, kinds: &ServedKinds) -> Result<(), String> {
        let what = format!("{}.{}", object.kind, object.group);
        let kind = held_kind(object, kinds).ok_or_else(|| format!("{what} is not served"))?;
        match self.named.get(&kind) {
            Some(at) if at.elapsed() >= LOADED_AFTER => Ok(()),
            Some(_) => Err(format!(
                "the hold policy names {what} only since a moment: the API server loads it within seconds"
            )),
            None => Err(format!("the hold policy does not name {what} yet")),
        }
    }

    /// At the end of a look: names the kinds of the holds the look made
    /// that the policy does not name yet, so that they are in force by the
    /// next look rather than the one after it (the next look's start would
    /// name them, and find them named only since a moment).
    pub async fn name_held_kinds(&mut self, kinds: &ServedKinds) {
        let named: BTreeSet<HeldKind> = self.named.keys().cloned().collect();
        if self.in_place() && named != self.held_kinds(kinds) {
            self.write_policy(kinds).await;
        }
    }

    /// How long until every kind the policy names is in force: the least
    /// pause before the next look, so that a tree waiting for it is ordered
    /// by that look.
    pub fn loading(&self) -> Duration {
        loading(self.named.values().map(Instant::elapsed))
    }

    /// The kinds of what is held.
    fn held_kinds(&self, kinds: &ServedKinds) -> BTreeSet<HeldKind> {
        self.entries
            .kinds()
            .filter_map(|(group, kind)| {
                let served = kinds.of_kind(Some(group), kind).next()?;
                Some((served.0.group.clone(), served.0.plural.clone()))
            })
            .collect()
    }

    /// The roots that hold anything.
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.entries.roots()
    }

    /// What is held for `root` now, each with the words it waits for.
    pub fn held_for(&self, root: &str) -> Held {
        self.entries
            .of_root(root)
            .filter_map(|k| {
                let object = parse_hold_key(k)?;
                let value = self.entries.map().get(k)?;
                Some((object, HoldEntry::parse(value).held_for))
            })
            .collect()
    }

    /// Holds `object` for `root` (of `root_kind`, `Kind.group`); why not,
    /// when it cannot be.
    pub fn hold(
        &mut self,
        object: &ObjectRef,
        root: &str,
        root_kind: &str,
        held_for: &str,
    ) -> Result<(), String> {
        let key = hold_key(object).ok_or_else(|| {
            "its name is too long to be held (a hold key has at most 253 characters: Kind_group_namespace_name)".to_string()
        })?;
        let value = HoldEntry {
            root: root.to_string(),
            root_kind: root_kind.to_string(),
            held_for: held_for.to_string(),
        }
        .value();
        if !self.entries.contains_key(&key)
            && self.entries.bytes() + key.len() + value.len() + 2 > MAX_BYTES
        {
            return Err(format!(
                "the record {HOLDS} is full ({} objects held)",
                self.entries.len()
            ));
        }
        self.entries.insert(key, value);
        Ok(())
    }

    pub fn release(&mut self, object: &ObjectRef) {
        if let Some(key) = hold_key(object) {
            self.entries.remove(&key);
        }
    }

    /// Lets go of everything held for a root `keep` does not name (it left:
    /// gone, relabelled out of its policy, its kind no longer ordered);
    /// what was held.
    pub fn release_roots_but(&mut self, keep: impl Fn(&str, &str) -> bool) -> Vec<ObjectRef> {
        self.entries
            .remove_unless(|_, entry| keep(&entry.root, &entry.root_kind))
            .into_iter()
            .filter_map(|(key, _)| parse_hold_key(&key))
            .collect()
    }

    /// At a start: reads the record (makes it when missing), takes in the
    /// objects an older release held with its label, writes the record,
    /// then the policy; later, puts the policy back when it was edited or
    /// deleted, and writes it again every resync.
    pub async fn prepare(&mut self, kinds: &ServedKinds, resync: Duration) {
        if !self.load().await {
            return;
        }
        if !self.migrated {
            self.take_in_old_labels(kinds).await;
        }
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.client.clone());
        if self.policy_written.is_none() {
            self.named_before(&policies, kinds).await;
        }
        let named: BTreeSet<HeldKind> = self.named.keys().cloned().collect();
        let compiled = compile_hold(&self.settings, self.record.namespace(), &named);
        let due = match self.policy_written {
            None => true,
            Some(at) if at.elapsed() > resync => true,
            Some(_) if self.checked.is_some_and(|at| at.elapsed() < CHECK_EVERY) => false,
            Some(_) => {
                self.checked = Some(Instant::now());
                let guard = compile_record_guard(&self.settings, self.record.namespace());
                let (hold, guard) = futures::join!(
                    super::drifted_pair(
                        (&policies, &compiled.policy),
                        (&bindings, &compiled.binding),
                        HOLD_OBJECT_NAME,
                    ),
                    super::drifted_pair(
                        (&policies, &guard.policy),
                        (&bindings, &guard.binding),
                        RECORD_GUARD_NAME,
                    ),
                );
                hold || guard
            }
        };
        if due || named != self.held_kinds(kinds) {
            self.write_policy(kinds).await;
        }
    }

    /// At a start: the kinds the policy already in the cluster names count
    /// as loaded (it was written before this controller began), so that a
    /// restart does not refuse, for a moment, the deletes of trees ordered
    /// before it.
    async fn named_before(
        &mut self,
        policies: &Api<ValidatingAdmissionPolicy>,
        kinds: &ServedKinds,
    ) {
        let Ok(Some(live)) = policies.get_opt(HOLD_OBJECT_NAME).await else {
            return;
        };
        let loaded = Instant::now()
            .checked_sub(LOADED_AFTER)
            .unwrap_or_else(Instant::now);
        let rules = live
            .spec
            .and_then(|s| s.match_constraints)
            .and_then(|m| m.resource_rules)
            .unwrap_or_default();
        let held = self.held_kinds(kinds);
        for rule in rules {
            if rule.operations.as_deref() != Some(&["DELETE".to_string()][..]) {
                continue;
            }
            for group in rule.api_groups.unwrap_or_default() {
                for plural in rule.resources.clone().unwrap_or_default() {
                    let kind = (group.clone(), plural);
                    if held.contains(&kind) {
                        self.named.insert(kind, loaded);
                    }
                }
            }
        }
    }

    /// Writes the policy naming the kinds held now; a kind it did not name
    /// before counts from now ([`LOADED_AFTER`]).
    async fn write_policy(&mut self, kinds: &ServedKinds) {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.client.clone());
        let wanted = self.held_kinds(kinds);
        let compiled = compile_hold(&self.settings, self.record.namespace(), &wanted);
        let guard = compile_record_guard(&self.settings, self.record.namespace());
        let params = PatchParams::apply(MANAGER).force();
        // In order, each only once the one before it is written: a binding
        // to a policy that failed to change would bind the old one.
        let written = async {
            policies
                .patch(HOLD_OBJECT_NAME, &params, &Patch::Apply(&compiled.policy))
                .await?;
            bindings
                .patch(HOLD_OBJECT_NAME, &params, &Patch::Apply(&compiled.binding))
                .await?;
            policies
                .patch(RECORD_GUARD_NAME, &params, &Patch::Apply(&guard.policy))
                .await?;
            bindings
                .patch(RECORD_GUARD_NAME, &params, &Patch::Apply(&guard.binding))
                .await
        }
        .await;
        match written {
            Ok(_) => {
                self.policy_written = Some(Instant::now());
                let now = Instant::now();
                self.named.retain(|k, _| wanted.contains(k));
                for kind in wanted {
                    self.named.entry(kind).or_insert(now);
                }
                if std::mem::take(&mut self.strip_old) {
                    let stripped = unhold::strip_old_labels(&self.client, kinds, |line| {
                        tracing::debug!("sibling order: {line}")
                    })
                    .await;
                    if stripped > 0 {
                        tracing::info!(stripped, "sibling order: took the old hold label off");
                    }
                }
            }
            Err(e) => {
                self.policy_written = None;
                tracing::error!(error = %e, "sibling order: cannot write the hold policy; trees are not ordered");
            }
        }
    }

    /// Writes what changed in the entries, then the policy if the kinds
    /// held changed; true when the record says what is held (whether each
    /// hold is in force yet is [`Self::in_force`]'s).
    pub async fn write(&mut self, kinds: &ServedKinds) -> bool {
        let written = self.write_record().await;
        if written && self.policy_written.is_some() {
            let named: BTreeSet<HeldKind> = self.named.keys().cloned().collect();
            if named != self.held_kinds(kinds) {
                self.write_policy(kinds).await;
            }
        }
        written
    }

    /// Reads the record once (again after a failed write): what a
    /// controller before this one held stays held until its tree is read.
    async fn load(&mut self) -> bool {
        if !self.record.load().await {
            return false;
        }
        if !std::mem::replace(&mut self.taken_in, true) {
            for (key, value) in decode_holds(&self.record.wanted) {
                self.entries.insert_if_absent(key, value);
            }
        }
        true
    }

    async fn write_record(&mut self) -> bool {
        if !self.load().await {
            return false;
        }
        let version = Some((self.entries.version(), self.record.reads()));
        if self.encoded != version {
            self.record.wanted = encode_holds(self.entries.map());
            self.encoded = version;
        }
        self.record.write().await
    }

    /// Objects an older release held with its label: held here for the same
    /// root (until their tree is read again) and written; the label is taken
    /// off (where cascade-guard may) once the policy that reads the entries
    /// is written.
    async fn take_in_old_labels(&mut self, kinds: &ServedKinds) {
        let found = holds::labelled(&self.client, kinds).await;
        let mut taken = 0;
        for (served, object) in &found.objects {
            let r = ObjectRef::new(
                &served.0.group,
                &served.0.kind,
                object.namespace().as_deref(),
                &object.name_any(),
            );
            let root = object.labels().get(HOLD_LABEL).cloned().unwrap_or_default();
            let held_for = object
                .annotations()
                .get(HELD_FOR_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            if object.metadata.deletion_timestamp.is_none()
                && !root.is_empty()
                && self.hold(&r, &root, "", &held_for).is_ok()
            {
                taken += 1;
            }
        }
        if !self.write_record().await {
            return;
        }
        self.migrated = true;
        self.strip_old = !found.objects.is_empty();
        if taken > 0 {
            tracing::info!(
                taken,
                "sibling order: objects held with the old label are held in the record {HOLDS} now"
            );
        }
    }
}

/// The kind of `object`, as the policy's rules name it.
fn held_kind(object: &ObjectRef, kinds: &ServedKinds) -> Option<HeldKind> {
    let served = kinds.of_kind(Some(&object.group), &object.kind).next()?;
    Some((served.0.group.clone(), served.0.plural.clone()))
}

#[cfg(test)]
mod tests;
