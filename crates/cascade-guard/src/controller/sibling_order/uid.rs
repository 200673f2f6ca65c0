//! An object's uid as sibling order keeps it: the API server's uids are
//! UUIDs, 36 characters that fit in 16 bytes. Kept as text they were two
//! heap blocks a root (a 36-byte string in each of the index, the last-read
//! record and the gate's marks): at 100,000 roots, about 15 MiB.
//!
//! Any other uid (tests, another API server) is kept as its text. A uid is
//! ordered as its text is, so that what is sorted by uid (the gate's record,
//! a look's trees) comes out as before.

use std::cmp::Ordering;
use std::fmt;

/// The length of a UUID's text.
const TEXT: usize = 36;
/// Where its hyphens are.
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Uid(Repr);

/// Which form: a uid that reads as a UUID in its canonical text (lower-case
/// hex, hyphens where they go) is only ever kept as `Uuid`, so that equal
/// texts are equal uids.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    pub fn new(text: &str) -> Self {
        Self(match uuid_bytes(text) {
            Some(bytes) => Repr::Uuid(bytes),
            None => Repr::Other(text.into()),
        })
    }

    /// Its text, with no allocation: a UUID written into `buf`.
    pub fn text<'a>(&'a self, buf: &'a mut [u8; TEXT]) -> &'a str {
        match &self.0 {
            Repr::Other(text) => text,
            Repr::Uuid(bytes) => {
                write_uuid(bytes, buf);
                // Hex digits and hyphens only.
                std::str::from_utf8(buf).unwrap_or_default()
            }
        }
    }

    /// How long its text is.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Uuid(_) => TEXT,
            Repr::Other(text) => text.len(),
        }
    }
}

impl From<&str> for Uid {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<&String> for Uid {
    fn from(text: &String) -> Self {
        Self::new(text)
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text(&mut [0; TEXT]))
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text(&mut [0; TEXT]))
    }
}

impl Ord for Uid {
    /// As their texts compare: for two UUIDs their bytes do (hex digits sort
    /// as their values, the hyphens are in the same places).
    fn cmp(&self, other: &Self) -> Ordering {
        match (&self.0, &other.0) {
            (Repr::Uuid(a), Repr::Uuid(b)) => a.cmp(b),
            (Repr::Other(a), Repr::Other(b)) => a.cmp(b),
            _ => self.text(&mut [0; TEXT]).cmp(other.text(&mut [0; TEXT])),
        }
    }
}

impl PartialOrd for Uid {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The 16 bytes of a UUID in canonical text, or None.
fn uuid_bytes(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != TEXT || HYPHENS.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut digits = text
        .iter()
        .enumerate()
        .filter(|(i, _)| !HYPHENS.contains(i))
        .map(|(_, c)| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        });
    let mut bytes = [0; 16];
    for byte in &mut bytes {
        let high = digits.next()??;
        let low = digits.next()??;
        *byte = high << 4 | low;
    }
    Some(bytes)
}

fn write_uuid(bytes: &[u8; 16], buf: &mut [u8; TEXT]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut at = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            buf[at] = b'-';
            at += 1;
        }
        buf[at] = HEX[usize::from(byte >> 4)];
        buf[at + 1] = HEX[usize::from(byte & 0xf)];
        at += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (text, kept as a UUID)
    const CASES: [(&str, bool); 9] = [
        ("0b4c9f7e-3d6a-4f0e-9a53-3c1f0c2e8d11", true),
        ("00000000-0000-0000-0000-000000000000", true),
        ("ffffffff-ffff-ffff-ffff-ffffffffffff", true),
        // Upper case would not come back as written.
        ("0B4C9F7E-3D6A-4F0E-9A53-3C1F0C2E8D11", false),
        ("0b4c9f7e3d6a4f0e9a533c1f0c2e8d11", false),
        ("0b4c9f7e-3d6a-4f0e-9a53-3c1f0c2e8d1", false),
        ("0b4c9f7e-3d6a-4f0e-9a53_3c1f0c2e8d11", false),
        ("0b4c9f7e-3d6a-4f0e-9a53-3c1f0c2e8d1g", false),
        ("root-1", false),
    ];

    #[test]
    fn a_uid_comes_back_as_written_and_a_uuid_in_16_bytes() {
        for (text, uuid) in CASES {
            let uid = Uid::new(text);
            assert_eq!(uid.to_string(), text);
            assert_eq!(uid.len(), text.len(), "{text}");
            assert_eq!(matches!(uid.0, Repr::Uuid(_)), uuid, "{text}");
        }
        assert_eq!(std::mem::size_of::<Uid>(), 24);
    }

    #[test]
    fn uids_sort_as_their_texts() {
        let mut texts: Vec<&str> = CASES.iter().map(|(t, _)| *t).collect();
        texts.extend([
            "",
            "0",
            "1",
            "0b4c9f7e-",
            "g",
            "ffffffff-ffff-ffff-ffff-fffffffffffff",
        ]);
        for a in &texts {
            for b in &texts {
                assert_eq!(Uid::new(a).cmp(&Uid::new(b)), a.cmp(b), "{a} {b}");
                assert_eq!(Uid::new(a) == Uid::new(b), a == b, "{a} {b}");
            }
        }
    }
}
