//! Which Kubernetes release the API server runs, against the releases
//! cascade-guard is proven on (`scripts/compat.sh`, README "Supported
//! Kubernetes versions"). Every proven release accepts the same policies, so
//! nothing is compiled differently; the release is only reported.

use std::fmt;

use k8s_openapi::apimachinery::pkg::version::Info;

/// The oldest release with ValidatingAdmissionPolicy v1 (GA in 1.30).
pub const OLDEST_SUPPORTED_MINOR: u32 = 30;
/// The newest release `scripts/compat.sh` has proven.
pub const NEWEST_PROVEN_MINOR: u32 = 37;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Proven by `scripts/compat.sh`.
    Proven,
    /// Newer than any proven release: likely fine, not proven.
    Newer,
    /// Older than 1.30: no ValidatingAdmissionPolicy v1, nothing is enforced.
    TooOld,
    /// The server's version could not be read as 1.MINOR.
    Unknown,
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (oldest, newest) = (OLDEST_SUPPORTED_MINOR, NEWEST_PROVEN_MINOR);
        match self {
            Support::Proven => write!(
                f,
                "a release cascade-guard is proven on (1.{oldest} to 1.{newest})"
            ),
            Support::Newer => write!(
                f,
                "newer than the releases cascade-guard is proven on (1.{oldest} to 1.{newest}); scripts/compat.sh checks a new one"
            ),
            Support::TooOld => write!(
                f,
                "older than 1.{oldest}: it has no ValidatingAdmissionPolicy v1, so cascade-guard's policies cannot be in force"
            ),
            Support::Unknown => write!(f, "a release whose version cannot be read as 1.MINOR"),
        }
    }
}

/// Reads the minor version the way providers report it ("30", "30+") (pure).
pub fn support(info: &Info) -> Support {
    let minor: String = info
        .minor
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    match (info.major.as_str(), minor.parse::<u32>()) {
        ("1", Ok(m)) if m < OLDEST_SUPPORTED_MINOR => Support::TooOld,
        ("1", Ok(m)) if m <= NEWEST_PROVEN_MINOR => Support::Proven,
        ("1", Ok(_)) => Support::Newer,
        _ => Support::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            ..Default::default()
        }
    }

    #[test]
    fn releases_are_placed_against_the_proven_range() {
        assert_eq!(support(&info("1", "29")), Support::TooOld);
        assert_eq!(support(&info("1", "30")), Support::Proven);
        assert_eq!(support(&info("1", "33+")), Support::Proven);
        assert_eq!(support(&info("1", "37")), Support::Proven);
        assert_eq!(support(&info("1", "38")), Support::Newer);
        assert_eq!(support(&info("1", "")), Support::Unknown);
        assert_eq!(support(&info("2", "0")), Support::Unknown);
    }
}
