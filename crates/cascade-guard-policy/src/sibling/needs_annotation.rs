//! The `cascade-guard.dev/needs` annotation (pure).
//!
//! On any object, a comma-separated list of what it needs; blanks around
//! entries and empty entries are ignored. Each entry is one of:
//!
//! - `name` (no `/`): a composition resource name: the object composed by the
//!   same XR whose annotation `crossplane.io/composition-resource-name` is
//!   `name`. A Composition author can write this, since the final names are
//!   generated.
//! - `Kind.group/name`, or `Kind/name` for the core group: an object in the
//!   annotated object's namespace, else a cluster-scoped one.
//! - `Kind.group/namespace/name` (`Kind/namespace/name`): an object in
//!   another namespace.
//!
//! For example `cascade-guard.dev/needs: cluster, ProviderConfig.helm.crossplane.io/prod-helm`.
//! An entry that cannot be read ([`parse_needs`]) or names nothing is a
//! [`ReadProblem`](super::graph::ReadProblem).

/// Annotation by which any object names what it needs (see the module doc).
pub const NEEDS_ANNOTATION: &str = "cascade-guard.dev/needs";

/// Crossplane's annotation on a composed resource: its name in the Composition.
pub const COMPOSITION_RESOURCE_NAME_ANNOTATION: &str = "crossplane.io/composition-resource-name";

/// One entry of [`NEEDS_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeedsEntry {
    /// A sibling, by its `crossplane.io/composition-resource-name`.
    CompositionResource(String),
    /// An object; without a namespace, the annotated object's (else a
    /// cluster-scoped one).
    Object {
        group: String,
        kind: String,
        namespace: Option<String>,
        name: String,
    },
}

/// An annotation entry that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cascade-guard.dev/needs entry {entry:?} cannot be read: {why}")]
pub struct MalformedNeeds {
    pub entry: String,
    pub why: &'static str,
}

/// Reads [`NEEDS_ANNOTATION`]: each non-empty entry, read or not.
pub fn parse_needs(annotation: &str) -> Vec<Result<NeedsEntry, MalformedNeeds>> {
    annotation
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(parse_needs_entry)
        .collect()
}

fn parse_needs_entry(entry: &str) -> Result<NeedsEntry, MalformedNeeds> {
    let bad = |why| MalformedNeeds {
        entry: entry.to_string(),
        why,
    };
    if entry.chars().any(char::is_whitespace) {
        return Err(bad("it contains blanks"));
    }
    let parts: Vec<&str> = entry.split('/').collect();
    let (kind_group, namespace, name) = match parts.as_slice() {
        [name] => return Ok(NeedsEntry::CompositionResource(name.to_string())),
        [kind_group, name] => (*kind_group, None, *name),
        [kind_group, namespace, name] => (*kind_group, Some(*namespace), *name),
        _ => return Err(bad("it has more than two '/'")),
    };
    if kind_group.is_empty() || name.is_empty() || namespace.is_some_and(str::is_empty) {
        return Err(bad("a part between '/' is empty"));
    }
    let (kind, group) = kind_group.split_once('.').unwrap_or((kind_group, ""));
    if kind_group.contains('.') && group.is_empty() {
        return Err(bad("the group after '.' is empty"));
    }
    if !kind.starts_with(|c: char| c.is_ascii_uppercase()) {
        return Err(bad("a kind starts with a capital letter (Kind.group/name)"));
    }
    Ok(NeedsEntry::Object {
        group: group.to_string(),
        kind: kind.to_string(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_needs_annotation_syntax() {
        let object = |group: &str, kind: &str, namespace: Option<&str>, name: &str| {
            Ok(NeedsEntry::Object {
                group: group.into(),
                kind: kind.into(),
                namespace: namespace.map(str::to_string),
                name: name.into(),
            })
        };
        let bad = |entry: &str, why| {
            Err(MalformedNeeds {
                entry: entry.into(),
                why,
            })
        };
        let cases = [
            ("", vec![]),
            (" , ,", vec![]),
            (
                "cluster",
                vec![Ok(NeedsEntry::CompositionResource("cluster".into()))],
            ),
            (
                "Cluster.eks.aws.upbound.io/prod",
                vec![object("eks.aws.upbound.io", "Cluster", None, "prod")],
            ),
            ("Secret/s", vec![object("", "Secret", None, "s")]),
            (
                "Secret/ns/s, cluster",
                vec![
                    object("", "Secret", Some("ns"), "s"),
                    Ok(NeedsEntry::CompositionResource("cluster".into())),
                ],
            ),
            ("a b", vec![bad("a b", "it contains blanks")]),
            ("A/b/c/d", vec![bad("A/b/c/d", "it has more than two '/'")]),
            ("A//c", vec![bad("A//c", "a part between '/' is empty")]),
            ("/c", vec![bad("/c", "a part between '/' is empty")]),
            ("A./c", vec![bad("A./c", "the group after '.' is empty")]),
            (
                "secret/s",
                vec![bad(
                    "secret/s",
                    "a kind starts with a capital letter (Kind.group/name)",
                )],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_needs(text), want, "{text:?}");
        }
    }
}
