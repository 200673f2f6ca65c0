//! The one way every time flag is written.

use std::time::Duration;

/// `90s`, `10m`, `1h`, or plain seconds.
pub fn humantime_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (90s, 10m, 1h)"))?;
    let seconds = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{text:?} is not a duration (90s, 10m, 1h)")),
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        for (text, want) in [
            ("90s", 90),
            ("10m", 600),
            ("1h", 3600),
            ("600", 600),
            ("0", 0),
        ] {
            assert_eq!(
                humantime_duration(text),
                Ok(Duration::from_secs(want)),
                "{text}"
            );
        }
        assert!(humantime_duration("10 minutes").is_err());
    }
}
