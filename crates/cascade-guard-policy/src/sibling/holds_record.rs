//! The record of what sibling order holds (pure): the ConfigMap [`HOLDS`]
//! in the controller's namespace, one entry per object held, keyed by
//! [`hold_key`] (kind, group, namespace and name) with a [`HoldEntry`] (the
//! root's uid, what it waits for in words). The hold policy
//! ([`super::hold_policy`]) reads it; only the controller writes it.

use std::collections::BTreeMap;

use crate::sibling::object::ObjectRef;

/// The label by which cascade-guard held objects before it kept its holds in
/// [`HOLDS`]; it is taken off where seen, and holds nothing now.
pub const HOLD_LABEL: &str = "cascade-guard.dev/hold";
/// What a held object waited for, beside [`HOLD_LABEL`]; taken off with it.
pub const HELD_FOR_ANNOTATION: &str = "cascade-guard.dev/held-for";
/// The ConfigMap, in the controller's namespace, naming every object held.
pub const HOLDS: &str = "cascade-guard-holds";

/// The longest key a hold takes (the length of a ConfigMap key, where holds
/// were kept first).
const MAX_KEY: usize = 253;

/// An object's key in [`HOLDS`]: `Kind_group_namespace_name`, which the hold
/// policy builds again from a DELETE request alone. None of the four can
/// contain `_` (kinds are alphanumeric, the rest DNS names), so no two
/// objects share a key; `None` when it would be longer than 253 characters
/// (such an object cannot be held).
pub fn hold_key(object: &ObjectRef) -> Option<String> {
    let key = format!(
        "{}_{}_{}_{}",
        object.kind,
        object.group,
        object.namespace.as_deref().unwrap_or(""),
        object.name
    );
    let valid = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    (key.len() <= MAX_KEY && valid).then_some(key)
}

/// The object a [`hold_key`] names.
pub fn parse_hold_key(key: &str) -> Option<ObjectRef> {
    let mut parts = key.splitn(4, '_');
    let (kind, group, namespace, name) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if kind.is_empty() || name.is_empty() {
        return None;
    }
    Some(ObjectRef::new(
        group,
        kind,
        (!namespace.is_empty()).then_some(namespace),
        name,
    ))
}

/// The record's key under which every hold is kept, all in one string: a
/// line `<hold key>\t<entry value>` each, every line ending in `\n` and the
/// whole starting with one. The API server turns the whole ConfigMap into a
/// CEL value at every evaluation of the hold policy, for every DELETE of a
/// kind held, at a cost per map entry (about 0.9 µs on Kubernetes 1.37):
/// one string costs as little as one entry.
pub const HELD_KEY: &str = "held";

/// The record's data for these holds ([`hold_key`] to [`HoldEntry::value`]).
pub fn encode_holds(entries: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut held = String::from("\n");
    for (key, value) in entries {
        held.push_str(key);
        held.push('\t');
        held.push_str(value);
        held.push('\n');
    }
    BTreeMap::from([(HELD_KEY.to_string(), held)])
}

/// The holds a record's data holds: what [`encode_holds`] was given.
pub fn decode_holds(data: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    data.get(HELD_KEY)
        .map(String::as_str)
        .unwrap_or_default()
        .split('\n')
        .filter_map(|line| line.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What [`HOLDS`] says of one held object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldEntry {
    /// The uid of the root of the tree that holds it.
    pub root: String,
    /// The root's `Kind.group`: whether the root left can be told from its
    /// kind's listing alone, whatever other kind cannot be listed.
    pub root_kind: String,
    /// What it waits for, in words: the refusal quotes it.
    pub held_for: String,
}

impl HoldEntry {
    /// `<root uid> <Kind.group> <held for>`: neither of the first two has a
    /// space, and none has a tab or a line break (the record's separators).
    pub fn value(&self) -> String {
        let flat = |s: &str| s.replace(['\t', '\n', '\r'], " ");
        format!(
            "{} {} {}",
            flat(&self.root),
            flat(&self.root_kind),
            flat(&self.held_for)
        )
    }

    pub fn parse(value: &str) -> Self {
        let mut parts = value.splitn(3, ' ');
        Self {
            root: parts.next().unwrap_or_default().to_string(),
            root_kind: parts.next().unwrap_or_default().to_string(),
            held_for: parts.next().unwrap_or_default().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_key_is_built_from_what_a_delete_request_says() {
        let cases = [
            (
                ObjectRef::new("", "Secret", Some("apps"), "kubeconfig"),
                Some("Secret__apps_kubeconfig"),
            ),
            (
                ObjectRef::new(
                    "helm.m.crossplane.io",
                    "ProviderConfig",
                    Some("ns"),
                    "prod.helm",
                ),
                Some("ProviderConfig_helm.m.crossplane.io_ns_prod.helm"),
            ),
            (
                ObjectRef::new("helm.crossplane.io", "ProviderConfig", None, "default"),
                Some("ProviderConfig_helm.crossplane.io__default"),
            ),
            (
                ObjectRef::new("", "Secret", Some("ns"), &"a".repeat(250)),
                None,
            ),
            (ObjectRef::new("", "Secret", Some("ns"), "no/slash"), None),
        ];
        for (object, want) in cases {
            assert_eq!(hold_key(&object).as_deref(), want, "{object}");
            if let Some(key) = want {
                assert_eq!(parse_hold_key(key), Some(object), "{key}");
            }
        }
        assert_eq!(parse_hold_key("Secret__ns"), None);
        assert_eq!(parse_hold_key("_g_ns_name"), None);
    }

    #[test]
    fn holds_round_trip_through_the_records_encoding() {
        let entries = BTreeMap::from([
            (
                "Secret__team_kubeconfig".to_string(),
                HoldEntry {
                    root: "r-1".into(),
                    root_kind: "Cluster.example.org".into(),
                    held_for: "Release team/app\tand\nmore".into(),
                }
                .value(),
            ),
            (
                "XR_example.org__c".to_string(),
                "r-2 XR.example.org XR /s".to_string(),
            ),
        ]);
        let data = encode_holds(&entries);
        assert_eq!(
            data["held"],
            "\nSecret__team_kubeconfig\tr-1 Cluster.example.org Release team/app and more\nXR_example.org__c\tr-2 XR.example.org XR /s\n"
        );
        assert_eq!(decode_holds(&data), entries);
        assert_eq!(encode_holds(&BTreeMap::new())["held"], "\n");
        assert!(decode_holds(&BTreeMap::new()).is_empty());
        // What the policy asks of the string: the whole key, between a line
        // break and a tab.
        assert!(data["held"].contains("\nSecret__team_kubeconfig\t"));
        assert!(!data["held"].contains("\nSecret__team_kube\t"));
    }

    #[test]
    fn a_hold_entry_round_trips() {
        let entry = HoldEntry {
            root: "6f1c2e9a-0000-4000-8000-000000000001".into(),
            root_kind: "InferenceCluster.modelplane.ai".into(),
            held_for: "ServingStack ns/stack, XR ns/other".into(),
        };
        assert_eq!(
            entry.value(),
            "6f1c2e9a-0000-4000-8000-000000000001 InferenceCluster.modelplane.ai ServingStack ns/stack, XR ns/other"
        );
        assert_eq!(HoldEntry::parse(&entry.value()), entry);
        assert_eq!(
            HoldEntry::parse("bare"),
            HoldEntry {
                root: "bare".into(),
                root_kind: String::new(),
                held_for: String::new()
            }
        );
    }
}
