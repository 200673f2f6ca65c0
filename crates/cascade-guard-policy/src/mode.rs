//! How strictly deletes of a protected kind are treated.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shown::Shown;

/// What cascade-guard does with a delete that would not cascade in the
/// foreground.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum Mode {
    /// Refuse the delete and say how to do it safely.
    #[default]
    Refuse,
    /// Refuse it for now; cascade-guard turns it into a foreground delete.
    Convert,
    /// Let it through, with a warning to the client and an audit annotation.
    Warn,
    /// Do nothing.
    Off,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Refuse, Mode::Convert, Mode::Warn, Mode::Off];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Refuse => "Refuse",
            Mode::Convert => "Convert",
            Mode::Warn => "Warn",
            Mode::Off => "Off",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A deletion-policy value that is not one of the four modes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} is not a deletion policy; use one of Refuse, Convert, Warn or Off",
    Shown(value)
)]
pub struct UnknownMode {
    pub value: String,
}

impl FromStr for Mode {
    type Err = UnknownMode;

    /// Any case of the four names (`convert`, `CONVERT`), as the XRD
    /// annotation reads them, so that a flag, an environment variable and the
    /// chart's value accept what the annotation does; nothing else, not even
    /// surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownMode {
                value: s.to_string(),
            })
    }
}

impl Mode {
    /// Exactly one of the four spellings, as the CascadePolicy CRD's schema
    /// allows them: `render` reads a CascadePolicy file with it, so that it
    /// never accepts a policy the API server would refuse.
    pub fn parse_exact(s: &str) -> Result<Mode, UnknownMode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMode {
                value: s.to_string(),
            })
    }
}

/// Reads the XRD annotation leniently: people type annotations by hand, so
/// case and surrounding whitespace are forgiven. Anything else, the empty
/// string included, reads as [`Mode::Refuse`] with the problem returned: a typo
/// must make the guard stricter, never switch it off.
pub fn read_mode_annotation(value: &str) -> (Mode, Option<UnknownMode>) {
    let trimmed = value.trim();
    match Mode::ALL
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(trimmed))
    {
        Some(mode) => (mode, None),
        None => (
            Mode::Refuse,
            Some(UnknownMode {
                value: value.to_string(),
            }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_annotation_is_named_by_its_start_and_size() {
        let value = "x".repeat(300 * 1024);
        let (mode, problem) = read_mode_annotation(&value);
        assert_eq!(mode, Mode::Refuse);
        let message = problem.expect("unknown").to_string();
        assert!(message.len() < 400, "{} bytes", message.len());
        assert!(message.contains("307200 bytes in all"), "{message}");
    }

    #[test]
    fn parse_accepts_the_four_names_in_any_case_and_nothing_else() {
        let cases: &[(&str, Option<Mode>)] = &[
            ("Refuse", Some(Mode::Refuse)),
            ("Convert", Some(Mode::Convert)),
            ("Warn", Some(Mode::Warn)),
            ("Off", Some(Mode::Off)),
            ("off", Some(Mode::Off)),
            ("convert", Some(Mode::Convert)),
            ("REFUSE", Some(Mode::Refuse)),
            (" Off", None),
            ("Off ", None),
            ("", None),
            ("Disabled", None),
        ];
        for (input, want) in cases {
            assert_eq!(input.parse::<Mode>().ok(), *want, "input {input:?}");
        }
    }

    #[test]
    fn exact_parse_accepts_only_the_schemas_spellings() {
        for mode in Mode::ALL {
            assert_eq!(Mode::parse_exact(mode.as_str()), Ok(mode));
        }
        for input in ["off", "CONVERT", " Off", ""] {
            assert!(Mode::parse_exact(input).is_err(), "input {input:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        for mode in Mode::ALL {
            assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
        }
    }

    #[test]
    fn lenient_annotation_reading() {
        let cases: &[(&str, Mode, bool)] = &[
            ("Refuse", Mode::Refuse, false),
            ("Convert", Mode::Convert, false),
            ("Warn", Mode::Warn, false),
            ("Off", Mode::Off, false),
            ("off", Mode::Off, false),
            ("  WARN\n", Mode::Warn, false),
            ("cOnVeRt", Mode::Convert, false),
            ("\trefuse ", Mode::Refuse, false),
            // Everything else is Refuse plus a problem, never Off.
            ("", Mode::Refuse, true),
            ("   ", Mode::Refuse, true),
            ("Of", Mode::Refuse, true),
            ("Off-please", Mode::Refuse, true),
            ("false", Mode::Refuse, true),
            ("disabled", Mode::Refuse, true),
            ("0", Mode::Refuse, true),
            ("Ｏff", Mode::Refuse, true),
        ];
        for (input, want_mode, want_problem) in cases {
            let (mode, problem) = read_mode_annotation(input);
            assert_eq!(mode, *want_mode, "input {input:?}");
            assert_eq!(problem.is_some(), *want_problem, "input {input:?}");
            if let Some(p) = problem {
                assert_eq!(p.value, *input);
                assert!(p.to_string().contains("Refuse, Convert, Warn or Off"));
            }
        }
    }

    #[test]
    fn serde_uses_the_exact_strings() {
        for mode in Mode::ALL {
            let json = serde_json::to_value(mode).unwrap();
            assert_eq!(json, serde_json::Value::String(mode.to_string()));
            let back: Mode = serde_json::from_value(json).unwrap();
            assert_eq!(back, mode);
        }
        assert!(serde_json::from_str::<Mode>("\"off\"").is_err());
    }
}
