//! What the index keeps of each object: with 100,000 objects every byte
//! counts (kinds and namespaces kept once, the resourceVersion a number, no
//! owners: only a Usage's are read).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::{Index, KindKey, Meta};

/// What the index keeps of an object's [`Meta`]: with 100,000 objects
/// every byte counts (kinds and namespaces shared, the resourceVersion a
/// number, no owners: only a Usage's are read).
#[derive(Debug, PartialEq)]
pub(super) struct Stored {
    pub rv: u64,
    pub namespace: Option<Arc<str>>,
    pub name: Box<str>,
    pub deleting: bool,
    pub labels: BTreeMap<String, String>,
    pub controllers: Box<[(Arc<KindKey>, Box<str>)]>,
}

/// A resourceVersion as a number to compare: the API server's are numbers
/// (opaque by contract, so anything else is hashed: only "the same or not"
/// is asked of it).
pub(crate) fn version(rv: &str) -> u64 {
    rv.parse().unwrap_or_else(|_| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        rv.hash(&mut h);
        h.finish()
    })
}

impl Index {
    /// `kind`, kept once.
    pub(super) fn kind_name(&mut self, kind: &KindKey) -> Arc<KindKey> {
        if let Some(k) = self.kind_names.get(kind) {
            return k.clone();
        }
        let k = Arc::new(kind.clone());
        self.kind_names.insert(k.clone());
        k
    }

    pub(super) fn store(&mut self, meta: Meta) -> Stored {
        let namespace = meta.namespace.map(|ns| {
            if let Some(n) = self.namespaces.get(ns.as_str()) {
                return n.clone();
            }
            let n: Arc<str> = Arc::from(ns);
            self.namespaces.insert(n.clone());
            n
        });
        let controllers = meta
            .controllers
            .into_iter()
            .map(|(kind, uid)| (self.kind_name(&kind), uid.into_boxed_str()))
            .collect();
        Stored {
            rv: version(&meta.rv),
            namespace,
            name: meta.name.into_boxed_str(),
            deleting: meta.deleting,
            labels: meta.labels,
            controllers,
        }
    }
}
