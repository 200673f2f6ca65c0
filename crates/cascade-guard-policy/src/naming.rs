//! The name of every admission object cascade-guard writes, built in one
//! place ([`PairName`]) from what the object is for. A
//! ValidatingAdmissionPolicy and its binding share a name; each policy in
//! force is carried by two such pairs, one guarding DELETEs and one
//! guarding UPDATEs, whose names differ by prefix.

use crate::kind::Shape;
use crate::mode::Mode;
use crate::names::{
    CASCADE_POLICY_OBJECT_PREFIX, CLAIM_OBJECT_PREFIX, UPDATE_CASCADE_POLICY_OBJECT_PREFIX,
    UPDATE_CLAIM_OBJECT_PREFIX, UPDATE_XRD_OBJECT_PREFIX, UPDATE_XRDS_OBJECT_PREFIX,
    XRD_OBJECT_PREFIX, XRDS_OBJECT_PREFIX,
};
use crate::resolve::{Policy, Source};
use crate::selector::is_dns_subdomain;

/// What a pair of admission objects is for: all its names are built from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PairName {
    /// One source's own pair: a CascadePolicy's, or an XRD's whose kind is
    /// not shared (see [`is_shared`]; earlier releases named every XRD's
    /// pair so).
    Own(Source),
    /// The pair every XRD of one mode and shape shares: part 0 is named
    /// plainly; the other parts of a variant spread over several pairs end
    /// in their number; a rendered set (`render --set-name`) ends in its name.
    Shared {
        mode: Mode,
        shape: Shape,
        part: u64,
        set: Option<String>,
    },
}

impl PairName {
    /// The pair that carries `policy` (for a shared kind, the variant's
    /// first part; compiling spreads very many kinds over more).
    pub fn of(policy: &Policy) -> PairName {
        if is_shared(policy) {
            PairName::Shared {
                mode: policy.mode,
                shape: policy.kind.shape,
                part: 0,
                set: None,
            }
        } else {
            PairName::Own(policy.source.clone())
        }
    }

    /// The names of its DELETE and its UPDATE pair.
    pub fn names(&self) -> [String; 2] {
        [self.delete(), self.update()]
    }

    /// The name of the pair that guards DELETEs.
    pub fn delete(&self) -> String {
        match self {
            PairName::Own(source) => own_name(source, Guard::Delete),
            PairName::Shared {
                mode,
                shape,
                part,
                set,
            } => shared_name(XRDS_OBJECT_PREFIX, *mode, *shape, *part, set.as_deref()),
        }
    }

    /// The name of the pair that guards UPDATEs: a prefix of its own, not a
    /// suffix, so that no source name can make it equal a DELETE pair's.
    pub fn update(&self) -> String {
        match self {
            PairName::Own(source) => own_name(source, Guard::Update),
            PairName::Shared {
                mode,
                shape,
                part,
                set,
            } => shared_name(
                UPDATE_XRDS_OBJECT_PREFIX,
                *mode,
                *shape,
                *part,
                set.as_deref(),
            ),
        }
    }
}

#[derive(Clone, Copy)]
enum Guard {
    Delete,
    Update,
}

/// Whether a policy's objects are shared with other kinds: an XRD's are,
/// unless its kind's names could not be in a valid admission rule (possible
/// only with an XRD no CRD can be made from, such as a plural `*`); such a
/// kind gets a pair of its own, so that the API server refusing it refuses
/// nothing else.
pub fn is_shared(policy: &Policy) -> bool {
    let plain_plural = is_dns_subdomain(&policy.kind.plural) && !policy.kind.plural.contains('.');
    let plain_group = policy.kind.group.is_empty() || is_dns_subdomain(&policy.kind.group);
    matches!(policy.source, Source::Xrd { .. }) && plain_plural && plain_group
}

/// `cascade-guard-policy-<name>`, or `cascade-guard-xrd-<name>` for an XRD
/// whose kind is not shared: the DELETE pair of one source
/// ([`PairName::Own`]).
pub fn object_name(source: &Source) -> String {
    PairName::Own(source.clone()).delete()
}

/// `cascade-guard-update-xrd-<name>` or `cascade-guard-update-policy-<name>`:
/// the UPDATE pair of one source.
pub fn update_object_name(source: &Source) -> String {
    PairName::Own(source.clone()).update()
}

fn shared_name(prefix: &str, mode: Mode, shape: Shape, part: u64, set: Option<&str>) -> String {
    let shape = match shape {
        Shape::CompositeResource => "composite",
        Shape::Claim => "claim",
        Shape::Other => "other",
    };
    let mode = mode.as_str().to_ascii_lowercase();
    let name = match part {
        0 => format!("{prefix}{mode}-{shape}"),
        part => format!("{prefix}{mode}-{shape}-{part}"),
    };
    match set {
        Some(set) => format!("{name}-{set}"),
        None => name,
    }
}

/// A source's own pair is named by its prefix and the source's name. A name
/// that would be too long, or is not a valid object name (possible only
/// with hand-written files), is cleaned and truncated, with a hash of the
/// source name appended so distinct sources keep distinct names.
fn own_name(source: &Source, guard: Guard) -> String {
    let (name, [delete, update]) = match source {
        Source::Xrd {
            name, claim: true, ..
        } => (name, [CLAIM_OBJECT_PREFIX, UPDATE_CLAIM_OBJECT_PREFIX]),
        Source::Xrd { name, .. } => (name, [XRD_OBJECT_PREFIX, UPDATE_XRD_OBJECT_PREFIX]),
        Source::CascadePolicy { name } => (
            name,
            [
                CASCADE_POLICY_OBJECT_PREFIX,
                UPDATE_CASCADE_POLICY_OBJECT_PREFIX,
            ],
        ),
    };
    let prefix = match guard {
        Guard::Delete => delete,
        Guard::Update => update,
    };
    prefixed_name(prefix, name)
}

const MAX_NAME: usize = 253;
const HASH_HEX: usize = 10;

fn prefixed_name(prefix: &str, raw: &str) -> String {
    let plain = format!("{prefix}{raw}");
    if is_dns_subdomain(&plain) {
        return plain;
    }
    let cleaned: String = plain
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    // Each dot-separated label must start and end with a letter or digit.
    let labels: Vec<&str> = cleaned
        .split('.')
        .map(|l| l.trim_matches('-'))
        .filter(|l| !l.is_empty())
        .collect();
    let mut body = labels.join(".");
    body.truncate(MAX_NAME - 1 - HASH_HEX);
    let body = body.trim_end_matches(['-', '.']);
    let hash = fnv1a_64(raw.as_bytes());
    format!(
        "{body}-{:0width$x}",
        hash >> (64 - 4 * HASH_HEX),
        width = HASH_HEX
    )
}

/// FNV-1a: tiny, stable across releases and platforms, good enough to keep
/// truncated names apart (not a security boundary).
pub(crate) fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pair_is_named_from_what_it_is_for() {
        let xrd = |claim| Source::Xrd {
            name: "xs.example.org".into(),
            annotated: true,
            claim,
        };
        let cases = [
            (
                PairName::Shared {
                    mode: Mode::Refuse,
                    shape: Shape::CompositeResource,
                    part: 0,
                    set: None,
                },
                [
                    "cascade-guard-xrds-refuse-composite",
                    "cascade-guard-update-xrds-refuse-composite",
                ],
            ),
            (
                PairName::Shared {
                    mode: Mode::Warn,
                    shape: Shape::Claim,
                    part: 3,
                    set: None,
                },
                [
                    "cascade-guard-xrds-warn-claim-3",
                    "cascade-guard-update-xrds-warn-claim-3",
                ],
            ),
            (
                PairName::Shared {
                    mode: Mode::Refuse,
                    shape: Shape::CompositeResource,
                    part: 0,
                    set: Some("modelplane".into()),
                },
                [
                    "cascade-guard-xrds-refuse-composite-modelplane",
                    "cascade-guard-update-xrds-refuse-composite-modelplane",
                ],
            ),
            (
                PairName::Own(Source::CascadePolicy { name: "dbs".into() }),
                [
                    "cascade-guard-policy-dbs",
                    "cascade-guard-update-policy-dbs",
                ],
            ),
            (
                PairName::Own(xrd(false)),
                [
                    "cascade-guard-xrd-xs.example.org",
                    "cascade-guard-update-xrd-xs.example.org",
                ],
            ),
            (
                PairName::Own(xrd(true)),
                [
                    "cascade-guard-claim-xs.example.org",
                    "cascade-guard-update-claim-xs.example.org",
                ],
            ),
        ];
        for (pair, want) in cases {
            assert_eq!(pair.names(), want.map(String::from), "{pair:?}");
        }
    }
}
