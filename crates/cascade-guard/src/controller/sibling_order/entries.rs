//! What sibling order holds, in memory: each hold key to its entry value,
//! indexed by the root that holds it, with the bytes they take kept as they
//! change. A look asks "what does this root hold" once a tree and checks the
//! record's room once a hold: a scan of every entry for each made a look
//! over 1,000 trees and 5,000 holds go through millions of entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::policy::sibling::holds_record::{HoldEntry, parse_hold_key};

#[derive(Debug, Default)]
pub(super) struct Entries {
    /// A hold key to its `HoldEntry` value.
    map: BTreeMap<String, String>,
    /// A root's uid to the keys it holds.
    by_root: HashMap<String, BTreeSet<String>>,
    /// What `map` takes in the record: a line each (key, tab, value, line break).
    bytes: usize,
    /// How many holds of each (group, kind): the hold policy names these.
    kinds: BTreeMap<(String, String), usize>,
    /// Counts the changes, so that the record is encoded again only after
    /// one.
    version: u64,
}

/// The (group, kind) of a hold key.
fn kind_of(key: &str) -> Option<(String, String)> {
    parse_hold_key(key).map(|o| (o.group, o.kind))
}

fn line_bytes(key: &str, value: &str) -> usize {
    key.len() + value.len() + 2
}

impl Entries {
    pub fn map(&self) -> &BTreeMap<String, String> {
        &self.map
    }

    /// Changes whenever an entry does.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The (group, kind) of every object held.
    pub fn kinds(&self) -> impl Iterator<Item = &(String, String)> {
        self.kinds.keys()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The roots that hold anything.
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.by_root.keys().map(String::as_str)
    }

    /// The keys `root` holds.
    pub fn of_root(&self, root: &str) -> impl Iterator<Item = &String> {
        self.by_root.get(root).into_iter().flatten()
    }

    pub fn insert(&mut self, key: String, value: String) {
        if self.map.get(&key) == Some(&value) {
            return;
        }
        self.remove(&key);
        self.version += 1;
        let root = HoldEntry::parse(&value).root;
        self.bytes += line_bytes(&key, &value);
        self.by_root.entry(root).or_default().insert(key.clone());
        if let Some(kind) = kind_of(&key) {
            *self.kinds.entry(kind).or_default() += 1;
        }
        self.map.insert(key, value);
    }

    /// Inserts unless the key is there already.
    pub fn insert_if_absent(&mut self, key: String, value: String) {
        if !self.map.contains_key(&key) {
            self.insert(key, value);
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<String> {
        let value = self.map.remove(key)?;
        self.version += 1;
        self.bytes -= line_bytes(key, &value);
        if let Some(kind) = kind_of(key)
            && let Some(n) = self.kinds.get_mut(&kind)
        {
            *n -= 1;
            if *n == 0 {
                self.kinds.remove(&kind);
            }
        }
        let root = HoldEntry::parse(&value).root;
        if let Some(keys) = self.by_root.get_mut(&root) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_root.remove(&root);
            }
        }
        Some(value)
    }

    /// Removes every entry `keep` says no to (given its key and entry);
    /// what was removed.
    pub fn remove_unless(
        &mut self,
        keep: impl Fn(&str, &HoldEntry) -> bool,
    ) -> Vec<(String, String)> {
        let gone: Vec<String> = self
            .map
            .iter()
            .filter(|(k, v)| !keep(k, &HoldEntry::parse(v)))
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| self.remove(&k).map(|v| (k, v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(root: &str) -> String {
        HoldEntry {
            root: root.into(),
            root_kind: "XR.example.org".into(),
            held_for: "XR ns/x".into(),
        }
        .value()
    }

    #[test]
    fn the_index_and_the_size_follow_every_change() {
        let mut e = Entries::default();
        e.insert("a".into(), value("r1"));
        e.insert("b".into(), value("r1"));
        e.insert("c".into(), value("r2"));
        e.insert("Secret__ns_s".into(), value("r2"));
        e.insert("Secret__ns_t".into(), value("r2"));
        let secrets = || (String::new(), "Secret".to_string());
        assert_eq!(e.kinds().collect::<Vec<_>>(), [&secrets()]);
        e.remove("Secret__ns_s");
        assert_eq!(e.kinds().collect::<Vec<_>>(), [&secrets()]);
        e.remove("Secret__ns_t");
        assert_eq!(e.kinds().count(), 0);
        assert_eq!(e.of_root("r1").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(e.of_root("r2").collect::<Vec<_>>(), ["c"]);
        let bytes = |e: &Entries| -> usize { e.map().iter().map(|(k, v)| line_bytes(k, v)).sum() };
        assert_eq!(e.bytes(), bytes(&e));

        // Held again for another root: moved, not counted twice.
        e.insert("b".into(), value("r2"));
        assert_eq!(e.of_root("r1").collect::<Vec<_>>(), ["a"]);
        assert_eq!(e.of_root("r2").collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(e.bytes(), bytes(&e));

        e.insert_if_absent("a".into(), value("r3"));
        assert_eq!(e.of_root("r3").count(), 0);

        assert_eq!(e.remove("a"), Some(value("r1")));
        assert_eq!(e.of_root("r1").count(), 0);
        assert!(!e.by_root.contains_key("r1"));
        assert_eq!(e.remove("a"), None);

        let gone = e.remove_unless(|_, entry| entry.root != "r2");
        assert_eq!(gone.len(), 2);
        assert_eq!(e.len(), 0);
        assert_eq!(e.bytes(), 0);
        assert!(e.by_root.is_empty());
    }
}
