//! Values from outside (an annotation, a CascadePolicy's fields, a label) as
//! messages quote them: in quotes, escaped, and cut to a length a log line,
//! an Event, a condition and `status` can carry. A 300 KB annotation is
//! named by its start and its size, never repeated whole.

use std::fmt;

/// How many characters of a value a message quotes.
pub const SHOWN_CHARS: usize = 80;

/// A value as a message quotes it ([`fmt::Display`]).
pub struct Shown<'a>(pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.0;
        match value.char_indices().nth(SHOWN_CHARS) {
            None => write!(f, "{value:?}"),
            Some((end, _)) => write!(f, "{:?}… ({} bytes in all)", &value[..end], value.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_and_sized_short_ones_quoted_whole() {
        assert_eq!(Shown("Refuse").to_string(), "\"Refuse\"");
        assert_eq!(Shown("a\"b").to_string(), "\"a\\\"b\"");
        let huge = "é".repeat(150_000);
        let shown = Shown(&huge).to_string();
        assert!(shown.len() < 400, "{}", shown.len());
        assert!(shown.ends_with("… (300000 bytes in all)"), "{shown}");
    }
}
