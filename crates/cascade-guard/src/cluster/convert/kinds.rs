//! Which kinds Convert runs for, and where the API server serves them.

use std::collections::BTreeMap;

use kube::Client;

use crate::cluster::served_resource;
use crate::policy::cascade::Reach;
use crate::policy::{Mode, Policy, ProtectedKind, Shape};

/// One kind as the Convert controller runs it: which of its live objects
/// are held (every Convert policy for the kind together), and which of its
/// composed ones (every Refuse and Warn policy, with `--hold-composed`).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertKind {
    pub kind: ProtectedKind,
    pub reach: Reach,
    /// Objects with a controller owner reference (composed by Crossplane)
    /// held within this reach too: Crossplane's own delete of one is then
    /// let through and made a foreground cascade
    /// ([`crate::policy::AllowReason::CrossplaneHeld`]).
    pub composed: Reach,
}

impl ConvertKind {
    /// A kind only finished: nothing live is held any more.
    pub fn nothing(kind: ProtectedKind) -> Self {
        Self {
            kind,
            reach: Reach::Nothing,
            composed: Reach::Nothing,
        }
    }

    /// No live object of the kind is in reach.
    pub fn reaches_nothing(&self) -> bool {
        self.reach == Reach::Nothing && self.composed == Reach::Nothing
    }

    /// A Convert policy names the kind.
    pub fn converts(&self) -> bool {
        self.reach != Reach::Nothing
    }
}

/// The Convert kinds a pass's policies ask for, by `group/kind`. An object is
/// in reach when any policy's selector matches it; a policy without a
/// selector, or with one that cannot be read, reaches every object (holding
/// more is the safe side). With `hold_composed`, the composed objects of
/// Refuse and Warn kinds (never claims) are held as well.
pub fn convert_kinds(policies: &[Policy], hold_composed: bool) -> BTreeMap<String, ConvertKind> {
    let mut by_kind: BTreeMap<String, ConvertKind> = BTreeMap::new();
    for p in policies {
        let composed = match p.mode {
            Mode::Convert => false,
            Mode::Refuse | Mode::Warn if hold_composed && p.kind.shape != Shape::Claim => true,
            _ => continue,
        };
        let reach = match p.selector.clone().map(kube::core::Selector::try_from) {
            Some(Ok(selector)) if !selector.selects_all() => Reach::Selected(vec![selector]),
            _ => Reach::Every,
        };
        let entry = by_kind
            .entry(kind_key(&p.kind))
            .or_insert_with(|| ConvertKind {
                kind: p.kind.clone(),
                reach: Reach::Nothing,
                composed: Reach::Nothing,
            });
        let slot = if composed {
            &mut entry.composed
        } else {
            &mut entry.reach
        };
        *slot = widened(std::mem::replace(slot, Reach::Nothing), reach);
    }
    by_kind
}

/// `reach` and `more` together.
fn widened(reach: Reach, more: Reach) -> Reach {
    match (reach, more) {
        (Reach::Nothing, more) => more,
        (Reach::Selected(mut all), Reach::Selected(more)) => {
            all.extend(more);
            Reach::Selected(all)
        }
        _ => Reach::Every,
    }
}

pub fn kind_key(kind: &ProtectedKind) -> String {
    format!("{}/{}", kind.group, kind.kind)
}

/// Whether the kind is still served: false only when discovery says for sure
/// that it is not (its CRD is gone, and its objects with it).
pub(super) async fn is_served(client: &Client, kind: &ProtectedKind) -> bool {
    match served_resource(client, kind).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code != 404,
        Err(kube::Error::Discovery(
            kube::error::DiscoveryError::MissingResource(_)
            | kube::error::DiscoveryError::MissingApiGroup(_),
        )) => false,
        Err(_) => true,
    }
}

/// A CascadePolicy's policy for namespaced kind `kind` of `example.org`, for
/// the tests of what each loop runs for.
#[cfg(test)]
pub(crate) fn test_policy(kind: &str, mode: Mode, shape: Shape, selector: Option<&str>) -> Policy {
    Policy {
        kind: ProtectedKind {
            group: "example.org".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            scope: crate::policy::kind::Scope::Namespaced,
            shape,
        },
        mode,
        selector: selector.map(|s| serde_json::from_str(s).expect("selector")),
        source: crate::policy::Source::CascadePolicy { name: kind.into() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(kind: &str, mode: Mode, shape: Shape, selector: Option<&str>) -> Policy {
        test_policy(kind, mode, shape, selector)
    }

    /// Which kinds Convert runs, and what it holds of each: Convert
    /// policies' objects always; the composed objects of Refuse and Warn
    /// kinds (never claims) only with `--hold-composed`.
    #[test]
    fn the_policies_say_what_is_held() {
        let team = r#"{"matchLabels": {"team": "a"}}"#;
        let policies = [
            policy("Converted", Mode::Convert, Shape::CompositeResource, None),
            policy("Refused", Mode::Refuse, Shape::CompositeResource, None),
            policy("Warned", Mode::Warn, Shape::Other, Some(team)),
            policy("Claimed", Mode::Refuse, Shape::Claim, None),
            policy("Off", Mode::Off, Shape::CompositeResource, None),
            // Convert for some objects, Refuse for the rest.
            policy("Mixed", Mode::Convert, Shape::CompositeResource, Some(team)),
            policy("Mixed", Mode::Refuse, Shape::CompositeResource, None),
        ];
        let summary = |hold_composed| -> Vec<(String, &'static str, &'static str)> {
            let name = |r: &Reach| match r {
                Reach::Every => "every",
                Reach::Selected(_) => "selected",
                Reach::Nothing => "nothing",
            };
            convert_kinds(&policies, hold_composed)
                .into_iter()
                .map(|(k, c)| (k, name(&c.reach), name(&c.composed)))
                .collect()
        };
        let owned = |rows: &[(&str, &'static str, &'static str)]| -> Vec<(String, &'static str, &'static str)> {
            rows.iter().map(|(k, r, c)| (k.to_string(), *r, *c)).collect()
        };
        assert_eq!(
            summary(false),
            owned(&[
                ("example.org/Converted", "every", "nothing"),
                ("example.org/Mixed", "selected", "nothing"),
            ])
        );
        assert_eq!(
            summary(true),
            owned(&[
                ("example.org/Converted", "every", "nothing"),
                ("example.org/Mixed", "selected", "every"),
                ("example.org/Refused", "nothing", "every"),
                ("example.org/Warned", "nothing", "selected"),
            ])
        );
        let refused = &convert_kinds(&policies, true)["example.org/Refused"];
        assert!(!refused.converts() && !refused.reaches_nothing());
    }
}
