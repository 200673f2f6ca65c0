//! Where an XR lists the resources it composes, read one way for the
//! decision table, Convert and `trace`: every entry of
//! `spec.crossplane.resourceRefs` (Crossplane v2) and of `spec.resourceRefs`
//! (legacy XRs). An XR has one of the two; reading both means an object
//! written by either kind of XRD, or half-migrated, is never taken for one
//! with nothing to cascade.

use serde_json::Value;

/// The two places an XR lists its composed resources, as JSON pointers. The
/// admission CEL reads the same two fields (see `cel`).
pub const RESOURCE_REF_POINTERS: [&str; 2] =
    ["/spec/crossplane/resourceRefs", "/spec/resourceRefs"];

/// One composed resource an XR names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ComposedResource {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// The entry's own namespace, else the XR's (a namespaced XR composes in
    /// its namespace); None for a cluster-scoped XR's entry that names none.
    pub namespace: Option<String>,
}

/// What an XR says it composes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComposedResources {
    /// The complete entries, each once, in order of appearance.
    pub resources: Vec<ComposedResource>,
    /// Entries without an apiVersion, kind or name: they cannot be looked up,
    /// but they still count as something composed.
    pub incomplete: usize,
}

impl ComposedResources {
    /// Every entry, complete or not (a duplicate once). Zero exactly when the
    /// admission policy's CEL finds both lists empty or absent.
    pub fn count(&self) -> usize {
        self.resources.len() + self.incomplete
    }
}

/// Reads an XR's composed resources from its stored form (only its `spec` is
/// read); `xr_namespace` is the XR's own namespace, taken apart because a
/// typed client keeps metadata apart from the rest of the object.
pub fn composed_resources(xr: &Value, xr_namespace: Option<&str>) -> ComposedResources {
    let xr_namespace = xr_namespace.filter(|ns| !ns.is_empty());
    let mut out = ComposedResources::default();
    let entries = RESOURCE_REF_POINTERS
        .iter()
        .filter_map(|p| xr.pointer(p).and_then(Value::as_array))
        .flatten();
    for entry in entries {
        let field = |name: &str| {
            entry
                .get(name)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
        };
        let (Some(api_version), Some(kind), Some(name)) =
            (field("apiVersion"), field("kind"), field("name"))
        else {
            out.incomplete += 1;
            continue;
        };
        let resource = ComposedResource {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            namespace: field("namespace").or(xr_namespace).map(str::to_string),
        };
        if !out.resources.contains(&resource) {
            out.resources.push(resource);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(kind: &str, name: &str, ns: Option<&str>) -> ComposedResource {
        ComposedResource {
            api_version: "example.org/v1".into(),
            kind: kind.into(),
            name: name.into(),
            namespace: ns.map(str::to_string),
        }
    }

    /// What, the XR's namespace, the XR, the resources read, their count.
    type Case = (
        &'static str,
        Option<&'static str>,
        Value,
        Vec<ComposedResource>,
        usize,
    );

    #[test]
    fn reads_both_lists_with_the_xr_namespace_as_default() {
        let cases: Vec<Case> = vec![
            ("no spec", None, json!({}), vec![], 0),
            (
                "v2, namespaced",
                Some("team"),
                json!({"spec": {"crossplane": {"resourceRefs": [
                           {"apiVersion": "example.org/v1", "kind": "A", "name": "a"}]}}}),
                vec![r("A", "a", Some("team"))],
                1,
            ),
            (
                "legacy, cluster-scoped, own namespace",
                None,
                json!({"spec": {"resourceRefs": [
                    {"apiVersion": "example.org/v1", "kind": "B", "name": "b", "namespace": "x"},
                    {"apiVersion": "example.org/v1", "kind": "C", "name": "c"}]}}),
                vec![r("B", "b", Some("x")), r("C", "c", None)],
                2,
            ),
            (
                "both lists, a duplicate and an incomplete entry",
                Some(""),
                json!({"spec": {
                    "crossplane": {"resourceRefs": [
                        {"apiVersion": "example.org/v1", "kind": "A", "name": "a"},
                        {"kind": "NoVersion", "name": "n"}]},
                    "resourceRefs": [
                        {"apiVersion": "example.org/v1", "kind": "A", "name": "a"},
                        {"apiVersion": "example.org/v1", "kind": "D", "name": ""}]}}),
                vec![r("A", "a", None)],
                3,
            ),
            (
                "not a list",
                None,
                json!({"spec": {"crossplane": {"resourceRefs": "A/a"}}}),
                vec![],
                0,
            ),
        ];
        for (what, namespace, xr, want, count) in cases {
            let got = composed_resources(&xr, namespace);
            assert_eq!(got.resources, want, "{what}");
            assert_eq!(got.count(), count, "{what}");
        }
    }
}
