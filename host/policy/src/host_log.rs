//! The `host` interface granted to guests: logging, bounded per call. Each line goes to
//! `tracing` tagged with the policy; the last line is kept so that a trap's error can show it
//! (a guest's panic message arrives this way).

use crate::bindings::host::{Host, Level};
use crate::engine::CallState;

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

impl Host for CallState {
    fn log(&mut self, level: Level, message: String) {
        let log = &mut self.log;
        log.lines += 1;
        if log.lines > log.max_lines {
            // Dropped: a guest must not flood the node's log. The last line is still kept for
            // a trap's error, since a panic message comes last.
            log.last = Some(truncate(message, log.max_bytes));
            return;
        }
        let message = truncate(message, log.max_bytes);
        let policy = &*self.policy;
        match level {
            Level::Debug => tracing::debug!(policy, "{message}"),
            Level::Info => tracing::info!(policy, "{message}"),
            Level::Warn => tracing::warn!(policy, "{message}"),
            Level::Error => tracing::error!(policy, "{message}"),
        }
        log.last = Some(message);
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
