//! Value parsers for flags whose values are a fixed set that lives outside
//! clap (in the policy crate, which stays free of clap): they give clap the
//! set, so that `--help`, errors and the shells' completion list it.

use clap::builder::{PossibleValuesParser, TypedValueParser};

use crate::policy::Mode;

/// `--mode`, `--xrd-default-mode`: the four modes. Give the flag
/// `ignore_case = true`: Mode reads any case, as the XRD annotation does.
pub fn mode() -> impl TypedValueParser<Value = Mode> {
    PossibleValuesParser::new(Mode::ALL.map(Mode::as_str)).try_map(|text| text.parse::<Mode>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_offered_and_read_in_any_case() {
        let command = clap::Command::new("t").arg(
            clap::Arg::new("mode")
                .long("mode")
                .ignore_case(true)
                .value_parser(mode()),
        );
        let offered: Vec<String> = command
            .get_arguments()
            .flat_map(|a| a.get_possible_values())
            .map(|v| v.get_name().to_string())
            .collect();
        assert_eq!(offered, ["Refuse", "Convert", "Warn", "Off"]);
        let parsed = |value: &str| {
            command
                .clone()
                .try_get_matches_from(["t", "--mode", value])
                .ok()
                .and_then(|m| m.get_one::<Mode>("mode").copied())
        };
        assert_eq!(parsed("convert"), Some(Mode::Convert));
        assert_eq!(parsed("OFF"), Some(Mode::Off));
        assert_eq!(parsed("Refuse"), Some(Mode::Refuse));
        assert_eq!(parsed("delete"), None);
    }
}
