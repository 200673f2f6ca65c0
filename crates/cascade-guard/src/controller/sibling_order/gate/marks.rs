//! The gate's marks: how each root's tree stands, by uid, as compact as the
//! record allows: a generation as a number, a uid in 16 bytes, and whether
//! the root was read alone beside it. Kept as text, with a second set of
//! the roots read alone, they took about 30 MiB at 100,000 roots.
//!
//! What they encode to is the record's data, byte for byte what
//! [`encode_marks`](crate::policy::sibling::gate::encode_marks) makes of the
//! same marks as text (the admission policies read it).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::policy::sibling::gate::{ORDERED_KEY, TreeOrder, decode_marks};

use super::super::uid::Uid;

/// How one root's tree stands.
#[derive(Clone, Debug, PartialEq)]
struct Mark {
    order: Order,
    /// Read alone (nothing composed or referenced): left out first when the
    /// record would grow past its size.
    alone: bool,
}

/// A [`TreeOrder`], compact.
#[derive(Clone, Debug, PartialEq)]
enum Order {
    Ordered(i64),
    /// The record's value: why, in words.
    Unordered(Box<str>),
}

impl Order {
    fn of(value: &str) -> Self {
        match TreeOrder::parse(value) {
            TreeOrder::Ordered { generation } => Order::Ordered(generation),
            TreeOrder::Unordered { reason } => Order::Unordered(reason.into()),
        }
    }

    /// How long its value is in the record.
    fn len(&self) -> usize {
        match self {
            Order::Ordered(generation) => digits(*generation),
            Order::Unordered(reason) => reason.len(),
        }
    }
}

/// How many characters `n` takes written out.
fn digits(n: i64) -> usize {
    let sign = usize::from(n < 0);
    let mut n = n.unsigned_abs();
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    sign + digits
}

/// A root's uid to how its tree stands.
#[derive(Debug, Default)]
pub(crate) struct Marks(BTreeMap<Uid, Mark>);

impl Marks {
    /// Records how `root`'s tree stands (`value`: a [`TreeOrder`] value);
    /// true if that changed anything.
    pub fn mark(&mut self, root: &str, value: &str, alone: bool) -> bool {
        let mark = Mark {
            order: Order::of(value),
            alone,
        };
        let uid = Uid::new(root);
        if self.0.get(&uid) == Some(&mark) {
            return false;
        }
        self.0.insert(uid, mark);
        true
    }

    /// Forgets a root; true if it was marked.
    pub fn forget(&mut self, root: &str) -> bool {
        self.0.remove(&Uid::new(root)).is_some()
    }

    /// Forgets the roots `keep` does not name; true if any.
    pub fn forget_others(&mut self, keep: impl Fn(&Uid) -> bool) -> bool {
        let before = self.0.len();
        self.0.retain(|uid, _| keep(uid));
        self.0.len() != before
    }

    /// Takes in what a record's data says of roots not marked here (as not
    /// read alone).
    pub fn take_in(&mut self, data: &BTreeMap<String, String>) {
        for (uid, value) in decode_marks(data) {
            self.0.entry(Uid::new(&uid)).or_insert(Mark {
                order: Order::of(&value),
                alone: false,
            });
        }
    }

    /// Keeps the marks within `max` bytes of a record: roots read alone go
    /// first (a composite with nothing composed is never gated), the last
    /// by uid first, then any, from the last. How many were left out.
    pub fn fit(&mut self, max: usize) -> usize {
        let size = |uid: &Uid, m: &Mark| uid.len() + m.order.len() + 8;
        let mut total: usize = self.0.iter().map(|(u, m)| size(u, m)).sum();
        let before = self.0.len();
        let mut out = Vec::new();
        for (uid, m) in self.0.iter().rev().filter(|(_, m)| m.alone) {
            if total <= max {
                break;
            }
            total -= size(uid, m);
            out.push(uid.clone());
        }
        for uid in out {
            self.0.remove(&uid);
        }
        while total > max {
            let Some((uid, m)) = self.0.pop_last() else {
                break;
            };
            total -= size(&uid, &m);
        }
        before - self.0.len()
    }

    /// The record's data for these marks: the ordered trees all in one
    /// string under [`ORDERED_KEY`], each other one under its uid.
    pub fn encode(&self) -> BTreeMap<String, String> {
        let mut ordered = String::from(" ");
        let mut data = BTreeMap::new();
        let mut text = [0; 36];
        for (uid, mark) in &self.0 {
            match &mark.order {
                Order::Ordered(generation) => {
                    // Writing to a String does not fail.
                    let _ = write!(ordered, "{}={generation} ", uid.text(&mut text));
                }
                Order::Unordered(reason) => {
                    data.insert(uid.to_string(), reason.to_string());
                }
            }
        }
        data.insert(ORDERED_KEY.to_string(), ordered);
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::sibling::gate::encode_marks;

    const A: &str = "0b4c9f7e-3d6a-4f0e-9a53-3c1f0c2e8d11";
    const B: &str = "9f000000-3d6a-4f0e-9a53-3c1f0c2e8d11";
    const C: &str = "ffffffff-ffff-ffff-ffff-ffffffffffff";

    /// The marks as text, as the gate kept them before.
    fn as_text(marks: &[(&str, &str, bool)]) -> BTreeMap<String, String> {
        marks
            .iter()
            .map(|(uid, value, _)| (uid.to_string(), value.to_string()))
            .collect()
    }

    fn marked(marks: &[(&str, &str, bool)]) -> Marks {
        let mut m = Marks::default();
        for (uid, value, alone) in marks {
            m.mark(uid, value, *alone);
        }
        m
    }

    /// (uid, value, alone) marked in this order.
    type Case = &'static [(&'static str, &'static str, bool)];

    const CASES: [Case; 6] = [
        &[],
        &[(A, "1", true)],
        &[
            (C, "12", false),
            (A, "3", true),
            (B, "9223372036854775807", false),
        ],
        // Reasons, one of them all digits but for its prefix; a uid that is
        // not a UUID, and one that sorts among them.
        &[
            (A, "its kind cannot be listed", false),
            (B, "not ordered: 42", true),
            ("root-1", "2", false),
            ("0b4c", "5", true),
        ],
        // A uid named like the record's key of the ordered trees.
        &[("ordered", "cannot read", false), (A, "1", false)],
        &[("ordered", "7", false), (A, "1", false)],
    ];

    #[test]
    fn the_record_is_what_the_marks_as_text_made() {
        for case in CASES {
            let marks = marked(case);
            let data = marks.encode();
            assert_eq!(data, encode_marks(&as_text(case)), "{case:?}");
            // Taken in by a controller after this one: the same record.
            let mut again = Marks::default();
            again.take_in(&data);
            assert_eq!(again.encode(), data, "{case:?}");
        }
    }

    #[test]
    fn a_mark_changes_only_when_its_order_or_aloneness_does() {
        let mut marks = Marks::default();
        // (value, alone) -> changed
        let cases = [
            ("1", true, true),
            ("1", true, false),
            ("1", false, true),
            ("2", false, true),
            ("cannot read", false, true),
            ("cannot read", false, false),
        ];
        for (value, alone, changed) in cases {
            assert_eq!(marks.mark(A, value, alone), changed, "{value} {alone}");
        }
        assert!(marks.forget(A));
        assert!(!marks.forget(A));
    }

    #[test]
    fn taken_in_marks_never_replace_the_ones_made_here() {
        let mut marks = marked(&[(A, "2", true)]);
        marks.take_in(&encode_marks(&as_text(&[(A, "1", false), (B, "5", false)])));
        assert_eq!(
            marks.encode(),
            encode_marks(&as_text(&[(A, "2", false), (B, "5", false)]))
        );
        // Taken in: not alone, so kept before the ones read alone.
        assert_eq!(marks.fit(2 * (36 + 1 + 8)), 0);
        assert_eq!(marks.fit(36 + 1 + 8), 1);
        assert_eq!(marks.encode(), encode_marks(&as_text(&[(B, "5", false)])));
    }

    #[test]
    fn a_record_too_small_leaves_out_the_roots_read_alone_first() {
        let size = 36 + 1 + 8;
        const ALL: Case = &[(A, "1", false), (B, "1", true), (C, "1", true)];
        // (room, what stays)
        let cases: [(usize, Case); 5] = [
            (3 * size, ALL),
            (3 * size - 1, &[(A, "1", false), (B, "1", true)]),
            (2 * size, &[(A, "1", false), (B, "1", true)]),
            (size, &[(A, "1", false)]),
            (size - 1, &[]),
        ];
        for (room, stays) in cases {
            let mut marks = marked(ALL);
            assert_eq!(marks.fit(room), ALL.len() - stays.len(), "{room}");
            assert_eq!(marks.encode(), encode_marks(&as_text(stays)), "{room}");
        }
        // Past the alone ones, the last by uid go.
        let mut marks = marked(&[(A, "1", false), (C, "1", false)]);
        assert_eq!(marks.fit(size), 1);
        assert_eq!(marks.encode(), encode_marks(&as_text(&[(A, "1", false)])));
    }

    #[test]
    fn digits_counts_as_the_value_is_written() {
        for n in [0, 1, 9, 10, 99, 100, 12345, i64::MAX, -1, -10, i64::MIN] {
            assert_eq!(digits(n), n.to_string().len(), "{n}");
        }
    }
}
