//! The rules that read edges from the objects (see [`super::edge`] for
//! where each comes from).

use std::collections::HashMap;

use serde_json::Value;

use super::builder::Builder;
use super::edge::Provenance;
use super::graph::{COMPOSITE_LABEL, ReadProblemReason};
use super::index::UsageFact;
use super::needs_annotation::{NEEDS_ANNOTATION, NeedsEntry, parse_needs};
use super::object::{ObjectRef, group_of, is_go_between, join_words, str_at};
use super::resolved_references;

impl Builder<'_> {
    pub(super) fn infer_edges(&mut self) {
        // A resolved reference names no kind: it is matched by name among
        // the objects of the referrer's provider.
        let mut by_name: HashMap<(Option<String>, String), Vec<usize>> = HashMap::new();
        for (j, r) in self.refs.iter().enumerate() {
            by_name
                .entry((r.namespace.clone(), r.name.clone()))
                .or_default()
                .push(j);
        }
        for i in 0..self.refs.len() {
            self.resolved_references(i, &by_name);
            let (group, kind) = (self.refs[i].group.as_str(), self.refs[i].kind.as_str());
            let is_provider_config = matches!(kind, "ProviderConfig" | "ClusterProviderConfig");
            let is_secret = group.is_empty() && kind == "Secret";
            let is_usage = matches!(kind, "Usage" | "ClusterUsage")
                && matches!(
                    group,
                    "protection.crossplane.io" | "apiextensions.crossplane.io"
                );
            let is_kubernetes_object = kind == "Object"
                && matches!(
                    group,
                    "kubernetes.crossplane.io" | "kubernetes.m.crossplane.io"
                );
            self.provider_config_ref(i);
            if is_provider_config {
                self.credentials(i);
            }
            self.connection_secret(i);
            if is_secret {
                self.secret_controller(i);
            }
            if is_usage {
                self.usage(i);
            }
            if is_kubernetes_object {
                self.object_references(i);
            }
            self.annotation(i);
            self.blocking_owners(i);
        }
        self.edges
            .sort_by_key(|e| (e.object, e.needs, e.provenance, e.declared_by));
        self.edges.dedup_by_key(|e| (e.object, e.needs));
    }

    fn provider_config_ref(&mut self, i: usize) {
        let Some(r) = self.values[i].pointer("/spec/providerConfigRef") else {
            return;
        };
        let Some(name) = str_at(r, "/name") else {
            let m = "spec.providerConfigRef names no ProviderConfig".to_string();
            return self.problem(i, ReadProblemReason::Malformed, m);
        };
        let kind = str_at(r, "/kind").unwrap_or("ProviderConfig");
        let namespace = match kind {
            "ClusterProviderConfig" => None,
            _ => self.refs[i].namespace.clone(),
        };
        let key = (kind.to_string(), namespace, name.to_string());
        match self.by_kind_name.get(&key).cloned() {
            Some(found) => {
                // A provider's ProviderConfig is in its managed resources'
                // group or a parent of it (helm.m.crossplane.io for a
                // Release, aws.upbound.io for ec2.aws.upbound.io): when one
                // is, the same name in another provider's group is not this.
                let group = self.refs[i].group.as_str();
                let own: Vec<usize> = found
                    .iter()
                    .copied()
                    .filter(|&pc| group_family(group, &self.refs[pc].group))
                    .collect();
                let found = if own.is_empty() { found } else { own };
                for pc in found {
                    self.edge(i, pc, Provenance::ProviderConfigRef, i);
                }
            }
            None => {
                let m = format!(
                    "spec.providerConfigRef names {kind} {name}, which is not among the objects"
                );
                self.problem(i, ReadProblemReason::Unresolved, m);
            }
        }
    }

    /// A reference to a Secret: its name and namespace (defaulting to the
    /// object's own), or the problem.
    fn secret_ref(&mut self, i: usize, field: &str, pointer: &str) -> Option<usize> {
        let r = self.values[i].pointer(pointer)?;
        let Some(name) = str_at(r, "/name") else {
            let m = format!("{field} names no Secret");
            self.problem(i, ReadProblemReason::Malformed, m);
            return None;
        };
        let namespace = str_at(r, "/namespace").or(self.refs[i].namespace.as_deref());
        let Some(namespace) = namespace else {
            let m = format!("{field} names Secret {name} without a namespace");
            self.problem(i, ReadProblemReason::Unresolved, m);
            return None;
        };
        let found = self.exact("", "Secret", Some(namespace), name);
        if found.is_none() {
            let m =
                format!("{field} names Secret {namespace}/{name}, which is not among the objects");
            self.problem(i, ReadProblemReason::Unresolved, m);
        }
        found
    }

    fn credentials(&mut self, i: usize) {
        let field = "spec.credentials.secretRef";
        if let Some(secret) = self.secret_ref(i, field, "/spec/credentials/secretRef") {
            self.edge(i, secret, Provenance::CredentialsSecretRef, i);
        }
    }

    fn connection_secret(&mut self, i: usize) {
        let field = "spec.writeConnectionSecretToRef";
        if let Some(secret) = self.secret_ref(i, field, "/spec/writeConnectionSecretToRef") {
            self.edge(secret, i, Provenance::WriteConnectionSecretToRef, i);
        }
    }

    fn secret_controller(&mut self, i: usize) {
        let controllers: Vec<usize> = self.links[i]
            .iter()
            .filter(|o| o.controller)
            .map(|o| o.owner)
            .collect();
        for owner in controllers {
            self.edge(i, owner, Provenance::SecretController, i);
        }
    }

    fn blocking_owners(&mut self, i: usize) {
        let blocking: Vec<usize> = self.links[i]
            .iter()
            .filter(|o| o.blocking && Some(o.owner) != self.owner_parent[i])
            .map(|o| o.owner)
            .collect();
        for owner in blocking {
            self.edge(i, owner, Provenance::OwnerReference, i);
        }
    }

    fn usage(&mut self, i: usize) {
        let default = match self.refs[i].kind.as_str() {
            "ClusterUsage" => None,
            _ => self.refs[i].namespace.clone(),
        };
        if self.values[i].pointer("/spec/of").is_none() {
            let m = "spec.of is missing".to_string();
            return self.problem(i, ReadProblemReason::Malformed, m);
        }
        let of = self.usage_side(i, "of", default.as_deref());
        let by = self.usage_side(i, "by", default.as_deref());
        if let (Some(of), Some(by)) = (of, by) {
            self.edge(by, of, Provenance::Usage, i);
            let composed = self.values[i]
                .pointer("/metadata/labels")
                .and_then(|l| l.get(COMPOSITE_LABEL))
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty());
            self.ix.usages.push(UsageFact {
                usage: i,
                of,
                by,
                composed,
            });
        }
    }

    fn usage_side(&mut self, i: usize, side: &str, default: Option<&str>) -> Option<usize> {
        let s = self.values[i].pointer(&format!("/spec/{side}"))?;
        let (Some(api_version), Some(kind)) = (str_at(s, "/apiVersion"), str_at(s, "/kind")) else {
            let m = format!("spec.{side} has no apiVersion or kind");
            self.problem(i, ReadProblemReason::Malformed, m);
            return None;
        };
        let Some(r) = s.get("resourceRef") else {
            let (reason, m) = if s.get("resourceSelector").is_some() {
                let m = format!(
                    "spec.{side} has only a resourceSelector, which Crossplane resolves into resourceRef: not guessed"
                );
                (ReadProblemReason::Unresolvable, m)
            } else {
                let m = format!("spec.{side} has no resourceRef");
                (ReadProblemReason::Malformed, m)
            };
            self.problem(i, reason, m);
            return None;
        };
        let Some(name) = str_at(r, "/name") else {
            let m = format!("spec.{side}.resourceRef has no name");
            self.problem(i, ReadProblemReason::Malformed, m);
            return None;
        };
        let what = (group_of(api_version), kind, name);
        let found = self.find(what, str_at(r, "/namespace"), default);
        if found.is_none() {
            let m = format!("spec.{side} names {kind} {name}, which is not among the objects");
            self.problem(i, ReadProblemReason::Unresolved, m);
        }
        found
    }

    fn resolved_references(
        &mut self,
        i: usize,
        by_name: &HashMap<(Option<String>, String), Vec<usize>>,
    ) {
        let read = resolved_references::read(self.values[i]);
        for field in read.unresolved_selectors {
            let m = format!("{field} is not resolved yet (no reference beside it)");
            self.problem(i, ReadProblemReason::Unresolvable, m);
        }
        for field in read.malformed {
            let m = format!("{field} names nothing");
            self.problem(i, ReadProblemReason::Malformed, m);
        }
        let Some(provider) =
            resolved_references::provider_of(&self.refs[i].group).map(str::to_string)
        else {
            return;
        };
        for reference in read.references {
            let namespace = reference
                .namespace
                .clone()
                .or_else(|| self.refs[i].namespace.clone());
            let found: Vec<usize> = by_name
                .get(&(namespace, reference.name.clone()))
                .into_iter()
                .flatten()
                .copied()
                .filter(|&j| {
                    j != i
                        && resolved_references::provider_of(&self.refs[j].group)
                            == Some(provider.as_str())
                        && !is_go_between(&self.refs[j])
                })
                .collect();
            match found.as_slice() {
                [one] => self.edge(i, *one, Provenance::ResolvedReference, i),
                [] => {
                    let m = format!(
                        "{} names {}, which is not among the objects of its provider read (a resolved reference names no kind: cascade-guard follows it only into what it read)",
                        reference.field, reference.name
                    );
                    self.problem(i, ReadProblemReason::Unresolved, m);
                }
                many => {
                    let names: Vec<String> =
                        many.iter().map(|&j| self.refs[j].to_string()).collect();
                    let m = format!(
                        "{} names {}, which several objects of its provider are ({}); it is not followed",
                        reference.field,
                        reference.name,
                        join_words(&names)
                    );
                    self.problem(i, ReadProblemReason::Unresolvable, m);
                }
            }
        }
    }

    fn object_references(&mut self, i: usize) {
        let references = self.values[i]
            .pointer("/spec/references")
            .and_then(Value::as_array);
        let mut targets = Vec::new();
        for reference in references.into_iter().flatten() {
            for (field, provenance) in [
                ("dependsOn", Provenance::DependsOn),
                ("patchesFrom", Provenance::PatchesFrom),
            ] {
                if let Some(t) = reference.get(field) {
                    targets.push((field, provenance, t));
                }
            }
        }
        let own_namespace = self.refs[i].namespace.clone();
        for (field, provenance, t) in targets {
            let (Some(api_version), Some(kind), Some(name)) = (
                str_at(t, "/apiVersion"),
                str_at(t, "/kind"),
                str_at(t, "/name"),
            ) else {
                let m = format!("a spec.references[].{field} has no apiVersion, kind or name");
                self.problem(i, ReadProblemReason::Malformed, m);
                continue;
            };
            let what = (group_of(api_version), kind, name);
            match self.find(what, str_at(t, "/namespace"), own_namespace.as_deref()) {
                Some(target) => self.edge(i, target, provenance, i),
                None => {
                    let m = format!(
                        "spec.references[].{field} names {kind} {name}, which is not among the objects"
                    );
                    self.problem(i, ReadProblemReason::Unresolved, m);
                }
            }
        }
    }

    fn annotation(&mut self, i: usize) {
        let Some(text) = self.values[i]
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(NEEDS_ANNOTATION))
            .and_then(Value::as_str)
        else {
            return;
        };
        for entry in parse_needs(text) {
            let found = match entry {
                Err(e) => {
                    self.problem(i, ReadProblemReason::Malformed, e.to_string());
                    continue;
                }
                Ok(NeedsEntry::CompositionResource(name)) => {
                    let Some(owner) = self.owner_parent[i] else {
                        let m = format!(
                            "{NEEDS_ANNOTATION} names composition resource {name:?}, but nothing among the objects composes this object"
                        );
                        self.problem(i, ReadProblemReason::Unresolved, m);
                        continue;
                    };
                    let found: Vec<usize> = self
                        .by_resource_name
                        .get(&(owner, name.clone()))
                        .into_iter()
                        .flatten()
                        .copied()
                        .filter(|&s| s != i)
                        .collect();
                    if found.is_empty() {
                        let m = format!(
                            "{NEEDS_ANNOTATION} names composition resource {name:?}, which {} does not compose among the objects",
                            self.refs[owner]
                        );
                        self.problem(i, ReadProblemReason::Unresolved, m);
                    }
                    found
                }
                Ok(NeedsEntry::Object {
                    group,
                    kind,
                    namespace,
                    name,
                }) => {
                    let default = self.refs[i].namespace.clone();
                    let what = (group.as_str(), kind.as_str(), name.as_str());
                    let found = self.find(what, namespace.as_deref(), default.as_deref());
                    match found {
                        Some(f) if f == i => {
                            let m = format!("{NEEDS_ANNOTATION} names the object itself");
                            self.problem(i, ReadProblemReason::Malformed, m);
                            continue;
                        }
                        Some(f) => vec![f],
                        None => {
                            let target = ObjectRef::new(&group, &kind, namespace.as_deref(), &name);
                            let m = format!(
                                "{NEEDS_ANNOTATION} names {target}, which is not among the objects"
                            );
                            self.problem(i, ReadProblemReason::Unresolved, m);
                            continue;
                        }
                    }
                }
            };
            for f in found {
                self.edge(i, f, Provenance::Annotation, i);
            }
        }
    }
}

/// `provider` is `group` or a parent domain of it.
fn group_family(group: &str, provider: &str) -> bool {
    group == provider
        || (!provider.is_empty()
            && group
                .strip_suffix(provider)
                .is_some_and(|head| head.ends_with('.')))
}

#[cfg(test)]
mod tests;
