//! How much of a message the API server keeps: an Event's note and a
//! condition's message have size limits, and a longer one is refused whole.

/// An Event's note (the API server refuses more than 1 kB).
pub(crate) fn event_note(message: &str) -> String {
    truncate(message, 1000)
}

/// A condition's message (the API server refuses more than 32 KiB).
pub(crate) fn condition_message(message: &str) -> String {
    truncate(message, 32 * 1024)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
