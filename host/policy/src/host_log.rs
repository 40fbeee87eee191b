//! The `host` interface granted to guests: logging, bounded per call. Each line goes to
//! `tracing` tagged with the policy; the last line is kept so that a trap's error can show it
//! (a guest's panic message arrives this way). The engine's per-call state implements the
//! interface by writing here.

use crate::bindings::host::Level;

/// The log of one call.
#[derive(Debug)]
pub(crate) struct GuestLog {
    lines: u32,
    max_lines: u32,
    max_bytes: usize,
    last: Option<String>,
}

impl GuestLog {
    pub(crate) fn new(max_lines: u32, max_bytes: usize) -> GuestLog {
        GuestLog { lines: 0, max_lines, max_bytes, last: None }
    }

    /// The last line logged, truncated.
    pub(crate) fn take_last(&mut self) -> Option<String> {
        self.last.take()
    }
}

/// `s` cut to at most `max` bytes at a character boundary, marked when cut.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

impl GuestLog {
    /// Logs a line of `policy` at `level`, within the call's bounds.
    pub(crate) fn write(&mut self, policy: &str, level: Level, message: String) {
        self.lines += 1;
        if self.lines > self.max_lines {
            // Dropped: a guest must not flood the node's log. The last line is still kept for
            // a trap's error, since a panic message comes last.
            self.last = Some(truncate(message, self.max_bytes));
            return;
        }
        let message = truncate(message, self.max_bytes);
        match level {
            Level::Debug => tracing::debug!(policy, "{message}"),
            Level::Info => tracing::info!(policy, "{message}"),
            Level::Warn => tracing::warn!(policy, "{message}"),
            Level::Error => tracing::error!(policy, "{message}"),
        }
        self.last = Some(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("hello".into(), 10), "hello");
        assert_eq!(truncate("hello world".into(), 8), "hello...");
        let t = truncate("ééééé".into(), 6);
        assert!(t.len() <= 6 && t.ends_with("..."), "{t}");
    }
}
