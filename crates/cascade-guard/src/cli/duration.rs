//! The one way every time flag is written: `90s`, `10m`, `1h`, `500ms`,
//! several at once as Go and kubectl write them (`1m30s`), or plain seconds.

use std::time::Duration;

/// What every time flag's help says it takes.
pub const SYNTAX: &str = "90s, 10m, 1h, 500ms, 1m30s, or plain seconds";

/// Reads a duration as every time flag takes it.
pub fn humantime_duration(text: &str) -> Result<Duration, String> {
    let wrong = || format!("{text:?} is not a duration ({SYNTAX})");
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Duration::from_secs).map_err(|_| wrong());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().map_err(|_| wrong())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3600)),
            _ => return Err(wrong()),
        };
        rest = &rest[unit..];
        total = total.saturating_add(part);
    }
    if text.is_empty() {
        return Err(wrong());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        for (text, millis) in [
            ("90s", 90_000),
            ("10m", 600_000),
            ("1h", 3_600_000),
            ("600", 600_000),
            ("0", 0),
            ("0s", 0),
            ("500ms", 500),
            ("1m30s", 90_000),
            ("1h5m", 3_900_000),
        ] {
            assert_eq!(
                humantime_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for wrong in ["10 minutes", "", "m", "1d", "1.5s", "-1s", "s10"] {
            assert!(humantime_duration(wrong).is_err(), "{wrong}");
        }
    }
}
