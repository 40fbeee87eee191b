//! Over-long lines of a line-protocol body, left out as the body arrives: a 20 MB line costs
//! the node a scan for its end, not a copy and a parse. The line is refused as any line that
//! does not parse is (InfluxDB's partial write: every other line is stored), and an empty line
//! takes its place, so the parser's line numbers still name the lines as sent.
//!
//! Lines are cut at every `\n`, also one inside a quoted string (the parser's physical lines),
//! so a quoted string cannot stretch a line past the limit.

use std::borrow::Cow;

use crate::line_protocol::{LineError, MAX_REPORTED_ERRORS, Parsed};

/// The longest line a body may hold, as VictoriaMetrics' default `-insert.maxLineSizeBytes`.
/// A series key is at most 512 bytes, so only a line of thousands of fields comes near it.
pub const MAX_LINE_BYTES: usize = 256 << 10;

/// Bytes of a left-out line quoted in its error.
const QUOTED_BYTES: usize = 80;

/// Copies a body into a buffer chunk by chunk, leaving out every line over its limit.
#[derive(Debug)]
pub struct LongLines {
    limit: usize,
    /// Where the current line starts in the buffer.
    start: usize,
    /// Whether the current line is over the limit and its bytes are being dropped.
    dropping: bool,
    /// Newlines are counted only to name a left-out line: up to `counted` bytes of the
    /// buffer, which begin line `line`.
    counted: usize,
    line: usize,
    /// The first left-out lines, and how many there were.
    errors: Vec<LineError>,
    count: usize,
}

impl LongLines {
    pub fn new(limit: usize) -> LongLines {
        LongLines { limit, start: 0, dropping: false, counted: 0, line: 1, errors: Vec::new(), count: 0 }
    }

    /// Appends `chunk`, the body's next bytes, to `out` (the buffer of every chunk before it),
    /// but the bytes of lines over the limit.
    pub fn copy(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let Some(first) = memchr::memchr(b'\n', chunk) else {
            self.extend_line(chunk, out);
            return;
        };
        let last = memchr::memrchr(b'\n', chunk).expect("a newline was found");
        self.extend_line(&chunk[..first], out);
        self.end_line(out);
        // The whole lines in between: none is over the limit if they span no more than it.
        if last > first {
            let whole = &chunk[first + 1..last];
            if whole.len() <= self.limit {
                out.extend_from_slice(whole);
                self.end_line(out);
            } else {
                for line in whole.split(|&b| b == b'\n') {
                    self.extend_line(line, out);
                    self.end_line(out);
                }
            }
        }
        self.extend_line(&chunk[last + 1..], out);
    }

    /// Appends bytes of the current line, or drops them once it is over the limit.
    fn extend_line(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if self.dropping {
            return;
        }
        if out.len() - self.start + bytes.len() > self.limit {
            self.drop_line(bytes, out);
        } else {
            out.extend_from_slice(bytes);
        }
    }

    /// Ends the current line with its newline (the only byte kept of a left-out line).
    fn end_line(&mut self, out: &mut Vec<u8>) {
        out.push(b'\n');
        self.start = out.len();
        self.dropping = false;
    }

    /// Takes the current line out of `out` (its first bytes were copied before it grew past
    /// the limit), names it, and drops the rest of it as it arrives.
    fn drop_line(&mut self, segment: &[u8], out: &mut Vec<u8>) {
        self.count += 1;
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.line += memchr::memchr_iter(b'\n', &out[self.counted..self.start]).count();
            self.counted = self.start;
            let mut head = out[self.start..].to_vec();
            head.extend_from_slice(&segment[..segment.len().min(QUOTED_BYTES)]);
            head.truncate(QUOTED_BYTES);
            let quoted = String::from_utf8_lossy(&head);
            self.errors.push(LineError {
                line: self.line,
                message: format!(
                    "unable to parse '{quoted}...': the line is longer than {} bytes, the most a line may take",
                    self.limit
                ),
            });
        }
        out.truncate(self.start);
        self.dropping = true;
    }

    /// Lines left out so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Adds the left-out lines to what the parser refused, in line order.
    pub fn refuse_in(self, parsed: &mut Parsed) {
        if self.count == 0 {
            return;
        }
        parsed.failed_lines += self.count;
        parsed.errors.extend(self.errors);
        parsed.errors.sort_by_key(|e| e.line);
        parsed.errors.truncate(MAX_REPORTED_ERRORS);
    }
}

/// A whole body in memory (a decompressed one) without its lines over `limit`: borrowed as it
/// is when it has none.
pub fn without_long_lines(body: &[u8], limit: usize) -> (Cow<'_, [u8]>, LongLines) {
    let mut lines = LongLines::new(limit);
    let within = body.split(|&b| b == b'\n').all(|line| line.len() <= limit);
    if within {
        return (Cow::Borrowed(body), lines);
    }
    let mut out = Vec::with_capacity(body.len());
    lines.copy(body, &mut out);
    (Cow::Owned(out), lines)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::line_protocol::{Precision, parse};

    /// `body` fed to a guard of `limit` in chunks of `chunk` bytes.
    fn fed(body: &[u8], limit: usize, chunk: usize) -> (Vec<u8>, LongLines) {
        let mut lines = LongLines::new(limit);
        let mut out = Vec::new();
        for c in body.chunks(chunk) {
            lines.copy(c, &mut out);
        }
        (out, lines)
    }

    #[test]
    fn a_line_over_the_limit_is_left_out_whatever_the_chunks_and_the_others_are_kept() {
        let long = format!("big,site=atl value=1,{}=2 5\n", "f".repeat(100));
        let body = format!("m value=1 1\n{long}m value=3 3\nm value=4 4");
        for chunk in [1, 2, 7, 64, 1000] {
            let (out, lines) = fed(body.as_bytes(), 40, chunk);
            assert_eq!(out, b"m value=1 1\n\nm value=3 3\nm value=4 4", "chunks of {chunk}");
            assert_eq!(lines.count(), 1);
            let mut parsed = parse(&out, Precision::S, 0);
            lines.refuse_in(&mut parsed);
            assert_eq!(parsed.points, 3);
            assert_eq!(parsed.failed_lines, 1);
            assert_eq!(parsed.errors.len(), 1);
            assert_eq!(parsed.errors[0].line, 2, "the line as sent is named");
            assert!(parsed.errors[0].message.contains("longer than 40 bytes"), "{:?}", parsed.errors[0]);
            assert!(parsed.errors[0].message.contains("big,site=atl value=1,fff"), "{:?}", parsed.errors[0]);
        }
    }

    #[test]
    fn lines_at_the_limit_pass_unchanged_and_one_byte_more_is_refused() {
        let at = "m value=1 1".to_string() + &" ".repeat(9);
        assert_eq!(at.len(), 20);
        let (body, lines) = without_long_lines(at.as_bytes(), 20);
        assert!(matches!(body, Cow::Borrowed(_)));
        assert_eq!(lines.count(), 0);
        let over = format!("{at} \nm value=2 2\n");
        let (body, lines) = without_long_lines(over.as_bytes(), 20);
        assert_eq!(&*body, b"\nm value=2 2\n");
        assert_eq!(lines.count(), 1);
    }

    #[test]
    fn a_last_line_without_its_newline_is_left_out_too_and_errors_stay_in_line_order() {
        let body = format!("{}\nm,x=1 bad\nm value=1 1\n{}", "a".repeat(50), "b".repeat(50));
        let (out, lines) = fed(body.as_bytes(), 30, 9);
        assert_eq!(out, b"\nm,x=1 bad\nm value=1 1\n");
        let mut parsed = parse(&out, Precision::S, 0);
        lines.refuse_in(&mut parsed);
        assert_eq!(parsed.failed_lines, 3);
        assert_eq!(parsed.errors.iter().map(|e| e.line).collect::<Vec<_>>(), [1, 2, 4]);
    }

    proptest! {
        /// Whatever the lines and the chunks: every line over the limit (and only those) is
        /// emptied, named by its number, and the rest is copied as sent.
        #[test]
        fn the_copy_is_the_body_with_its_long_lines_emptied(
            lines in prop::collection::vec(0usize..40, 0..30),
            last_newline in any::<bool>(),
            limit in 0usize..30,
            chunk in 1usize..50,
        ) {
            let body: Vec<u8> = lines.iter().enumerate()
                .map(|(i, &n)| vec![b'a' + (i % 26) as u8; n]).collect::<Vec<_>>().join(&b'\n');
            let body = if last_newline { [body, b"\n".to_vec()].concat() } else { body };
            let expected: Vec<u8> = body.split(|&b| b == b'\n')
                .map(|l| if l.len() > limit { &[][..] } else { l }).collect::<Vec<_>>().join(&b'\n');
            let long: Vec<usize> = body.split(|&b| b == b'\n').enumerate()
                .filter(|(_, l)| l.len() > limit).map(|(i, _)| i + 1).collect();
            let (out, found) = fed(&body, limit, chunk);
            prop_assert_eq!(&out, &expected);
            prop_assert_eq!(found.count(), long.len());
            prop_assert_eq!(found.errors.iter().map(|e| e.line).collect::<Vec<_>>(), long.clone());
            let (whole, found) = without_long_lines(&body, limit);
            prop_assert_eq!(&*whole, &expected[..]);
            prop_assert_eq!(found.count(), long.len());
        }
    }
}
