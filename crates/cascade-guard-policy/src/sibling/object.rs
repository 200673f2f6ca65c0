//! An object as sibling order names it: its identity without the version,
//! and how it reads in a sentence.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

/// An object, as references match it: the version is not part of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The API group, "" for the core group.
    pub group: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn new(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            group: group.to_string(),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// The identity of a stored object; None without an apiVersion, kind or name.
    pub fn of_object(object: &Value) -> Option<Self> {
        let api_version = str_at(object, "/apiVersion")?;
        let kind = str_at(object, "/kind")?;
        let name = str_at(object, "/metadata/name")?;
        let namespace = str_at(object, "/metadata/namespace");
        Some(Self::new(group_of(api_version), kind, namespace, name))
    }
}

/// Sorted by kind, namespace and name (then group), the order of a wave.
impl Ord for ObjectRef {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.kind, &self.namespace, &self.name, &self.group).cmp(&(
            &other.kind,
            &other.namespace,
            &other.name,
            &other.group,
        ))
    }
}

impl PartialOrd for ObjectRef {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ObjectRef {
    /// `Kind name`, or `Kind namespace/name`; `Kind.group …` for the kinds
    /// every provider defines, where the name alone says too little (a
    /// helm and a kubernetes ProviderConfig often share one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        if PROVIDER_KINDS.contains(&self.kind.as_str()) && !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// Kinds that every Crossplane provider defines in its own group.
const PROVIDER_KINDS: [&str; 3] = [
    "ProviderConfig",
    "ClusterProviderConfig",
    "ProviderConfigUsage",
];

/// Objects that do nothing of their own while deleted: they need what they
/// need only for whoever reads them (`plan`'s pictures dim them).
pub fn is_go_between(r: &ObjectRef) -> bool {
    matches!(r.kind.as_str(), "ProviderConfig" | "ClusterProviderConfig")
        || (r.group.is_empty() && matches!(r.kind.as_str(), "Secret" | "ConfigMap"))
}

pub(super) fn str_at<'v>(value: &'v Value, pointer: &str) -> Option<&'v str> {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The group of an apiVersion: "" for the core group's `v1`.
pub(super) fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

/// `a`, `a and b`, `a, b and c`.
pub(super) fn join_words(words: &[String]) -> String {
    match words {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}
