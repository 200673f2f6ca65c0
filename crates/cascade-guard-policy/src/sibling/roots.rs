//! Which objects of the ordered kinds begin a tree of their own.
//!
//! An object is a root when nothing controls it, and also when what
//! controlled it is gone: its controller reference names an object of a kind
//! that was listed in full, yet no object of that kind has the uid. Such an
//! object is what a break-glass orphan delete, or the garbage collector
//! after one, leaves behind: the garbage collector may still delete it (its
//! owner is gone), and a tree that nobody orders any more loses its holds
//! just when that teardown begins.
//!
//! A controller of a kind that was not listed (not ordered, or its list
//! failed) proves nothing about its owner, so such an object stays a child.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The objects listed this tick: which kinds were listed in full, and the
/// uid of every object of them (selected or not).
#[derive(Clone, Debug, Default)]
pub struct Listed {
    kinds: BTreeSet<(String, String)>,
    uids: BTreeSet<String>,
}

impl Listed {
    /// Records a kind whose list succeeded, with the uids of its objects.
    pub fn add_kind<'a>(
        &mut self,
        group: &str,
        kind: &str,
        uids: impl IntoIterator<Item = &'a str>,
    ) {
        self.kinds.insert((group.to_string(), kind.to_string()));
        self.uids.extend(uids.into_iter().map(str::to_string));
    }

    /// Whether an object with these owner references begins a tree.
    pub fn is_root(&self, owners: &[OwnerReference]) -> bool {
        owners
            .iter()
            .filter(|o| o.controller == Some(true))
            .all(|o| self.controller_is_gone(o))
    }

    fn controller_is_gone(&self, owner: &OwnerReference) -> bool {
        let group = owner
            .api_version
            .rsplit_once('/')
            .map_or("", |(group, _version)| group);
        self.kinds
            .contains(&(group.to_string(), owner.kind.clone()))
            && !self.uids.contains(&owner.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(api_version: &str, kind: &str, uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: format!("{kind}-{uid}").to_lowercase(),
            uid: uid.to_string(),
            controller,
            block_owner_deletion: None,
        }
    }

    fn listed() -> Listed {
        let mut listed = Listed::default();
        listed.add_kind("example.org", "Region", ["region-1"]);
        listed.add_kind("example.org", "Fleet", ["fleet-1"]);
        listed.add_kind("", "ConfigMap", ["cm-1"]);
        listed
    }

    #[test]
    fn a_root_is_an_object_whose_controller_is_absent_or_gone() {
        let cases: &[(&str, Vec<OwnerReference>, bool)] = &[
            ("no owner at all", vec![], true),
            (
                "only a non-controller owner",
                vec![owner("example.org/v1", "Region", "region-1", None)],
                true,
            ),
            (
                "controller false",
                vec![owner("example.org/v1", "Region", "region-1", Some(false))],
                true,
            ),
            (
                "its controller is listed",
                vec![owner("example.org/v1", "Region", "region-1", Some(true))],
                false,
            ),
            (
                "its controller is gone (the orphaned subtree)",
                vec![owner("example.org/v1", "Region", "region-2", Some(true))],
                true,
            ),
            (
                "its controller is of a kind not listed (proves nothing)",
                vec![owner("example.org/v1", "Cloud", "cloud-9", Some(true))],
                false,
            ),
            (
                "same kind name in another group",
                vec![owner("other.org/v1", "Region", "region-2", Some(true))],
                false,
            ),
            (
                "a core kind: its apiVersion has no group",
                vec![owner("v1", "ConfigMap", "cm-2", Some(true))],
                true,
            ),
            (
                "a core kind still there",
                vec![owner("v1", "ConfigMap", "cm-1", Some(true))],
                false,
            ),
            (
                "another version of a listed kind counts as the kind",
                vec![owner("example.org/v2", "Fleet", "fleet-1", Some(true))],
                false,
            ),
            (
                "a gone non-controller beside a listed controller",
                vec![
                    owner("example.org/v1", "Region", "region-2", None),
                    owner("example.org/v1", "Fleet", "fleet-1", Some(true)),
                ],
                false,
            ),
        ];
        let listed = listed();
        for (name, owners, want) in cases {
            assert_eq!(listed.is_root(owners), *want, "{name}");
        }
    }

    #[test]
    fn nothing_listed_leaves_every_controlled_object_a_child() {
        let listed = Listed::default();
        assert!(!listed.is_root(&[owner("example.org/v1", "Region", "gone", Some(true))]));
        assert!(listed.is_root(&[]));
    }
}
