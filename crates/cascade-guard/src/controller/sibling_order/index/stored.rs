//! What the index keeps of each object, in 64 bytes beside its uid: with
//! 100,000 objects every byte counts. Kinds and namespaces are numbers into
//! tables that keep each once, the resourceVersion a number, a short name
//! kept inline, labels and controllers behind one pointer only when there
//! are any, the last read of a root in the object itself; no owners (only a
//! Usage's are read).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;

use super::super::uid::Uid;
use super::{Index, KindKey, Meta};

/// One object of a kind the index keeps.
#[derive(Debug)]
pub(super) struct Object {
    /// Its kind's number in [`Index`]'s table of kinds.
    pub kind: u32,
    pub rv: u64,
    pub namespace: Option<NonZeroU32>,
    pub name: Name,
    pub deleting: bool,
    /// Selected by one of its kind's policies.
    pub selected: bool,
    pub extra: Option<Box<Extra>>,
    /// Its tree's last read (when `read`), kept here rather than under a
    /// second key per root (at 100,000 roots a map of reads was 22 MiB).
    read: bool,
    read_rv: u64,
    read_number: u32,
    read_active: bool,
}

/// How a root's tree was last read.
#[derive(Clone, Copy, Debug)]
pub(super) struct LastRead {
    /// The root's resourceVersion read.
    pub rv: u64,
    /// The read's number: a resync queued for an older read is skipped.
    pub number: u32,
    /// Read again soon: being deleted, young, with writes still to make.
    pub active: bool,
}

/// What few objects have.
#[derive(Debug, PartialEq)]
pub(super) struct Extra {
    pub labels: BTreeMap<String, String>,
    /// Each as its kind's number and its uid.
    pub controllers: Box<[(u32, Uid)]>,
}

impl Object {
    /// The same as `other` but for its last read.
    pub fn same(&self, other: &Object) -> bool {
        self.kind == other.kind
            && self.rv == other.rv
            && self.namespace == other.namespace
            && self.name == other.name
            && self.deleting == other.deleting
            && self.selected == other.selected
            && self.extra == other.extra
    }

    pub fn last_read(&self) -> Option<LastRead> {
        self.read.then_some(LastRead {
            rv: self.read_rv,
            number: self.read_number,
            active: self.read_active,
        })
    }

    pub fn set_read(&mut self, read: Option<LastRead>) {
        self.read = read.is_some();
        let read = read.unwrap_or(LastRead {
            rv: 0,
            number: 0,
            active: false,
        });
        self.read_rv = read.rv;
        self.read_number = read.number;
        self.read_active = read.active;
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.extra.as_ref().map(|e| &e.labels)
    }

    pub fn controllers(&self) -> &[(u32, Uid)] {
        self.extra.as_ref().map_or(&[], |e| &e.controllers)
    }
}

/// An object's name: inline when short (most are), no heap block of its
/// own.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Name {
    Short { len: u8, bytes: [u8; SHORT] },
    Long(Box<str>),
}

/// The longest name kept inline: the enum is no bigger than a `Long`.
const SHORT: usize = 22;

impl Name {
    pub fn new(name: &str) -> Self {
        match u8::try_from(name.len()) {
            Ok(len) if name.len() <= SHORT => {
                let mut bytes = [0; SHORT];
                bytes[..name.len()].copy_from_slice(name.as_bytes());
                Name::Short { len, bytes }
            }
            _ => Name::Long(name.into()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            // Copied whole from a str: always UTF-8.
            Name::Short { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Name::Long(name) => name,
        }
    }
}

/// Values kept once each, by number.
#[derive(Debug)]
pub(super) struct Table<T> {
    all: Vec<T>,
    numbers: HashMap<T, u32>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            all: Vec::new(),
            numbers: HashMap::new(),
        }
    }
}

impl<T: Clone + Eq + Hash> Table<T> {
    /// `value`'s number, given it if new.
    pub fn number(&mut self, value: &T) -> u32 {
        if let Some(n) = self.numbers.get(value) {
            return *n;
        }
        // More than 4 billion kinds or namespaces: the last number is
        // shared (never reached).
        let n = u32::try_from(self.all.len()).unwrap_or(u32::MAX);
        self.all.push(value.clone());
        self.numbers.insert(value.clone(), n);
        n
    }

    /// `value`'s number, if it has one.
    pub fn find(&self, value: &T) -> Option<u32> {
        self.numbers.get(value).copied()
    }

    pub fn get(&self, n: u32) -> Option<&T> {
        self.all.get(usize::try_from(n).ok()?)
    }
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
    /// An object's kind, by its number.
    pub(super) fn kind_of(&self, o: &Object) -> Option<&KindKey> {
        self.kind_names.get(o.kind)
    }

    /// What the index keeps of `meta`, of `kind`, selected or not (not read).
    pub(super) fn store(&mut self, kind: &KindKey, meta: Meta, selected: bool) -> Object {
        let namespace = meta
            .namespace
            .map(|ns| self.namespaces.number(&ns.into_boxed_str()))
            .and_then(|n| NonZeroU32::new(n.wrapping_add(1)));
        let controllers: Box<[(u32, Uid)]> = meta
            .controllers
            .into_iter()
            .map(|(kind, uid)| (self.kind_names.number(&kind), Uid::new(&uid)))
            .collect();
        let extra = (!meta.labels.is_empty() || !controllers.is_empty()).then(|| {
            Box::new(Extra {
                labels: meta.labels,
                controllers,
            })
        });
        Object {
            kind: self.kind_names.number(kind),
            rv: version(&meta.rv),
            namespace,
            name: Name::new(&meta.name),
            deleting: meta.deleting,
            selected,
            extra,
            read: false,
            read_rv: 0,
            read_number: 0,
            read_active: false,
        }
    }

    /// An object's namespace, as the watch told it.
    pub(super) fn namespace_of(&self, o: &Object) -> Option<&str> {
        let n = o.namespace?.get() - 1;
        self.namespaces.get(n).map(|ns| &**ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_comes_back_as_it_was_inline_or_not() {
        let long = "n".repeat(SHORT + 1);
        for name in [
            "",
            "a",
            "scale-12345",
            &"x".repeat(SHORT),
            &long,
            "ünïcödé-näme",
        ] {
            let kept = Name::new(name);
            assert_eq!(kept.as_str(), name);
            assert_eq!(matches!(kept, Name::Short { .. }), name.len() <= SHORT);
        }
        assert_eq!(std::mem::size_of::<Name>(), 24);
        assert_eq!(std::mem::size_of::<Object>(), 64);
    }
}
