//! The bound on nesting while a message decodes. postcard decodes recursively and has no depth
//! limit of its own, so a recursive message type ([`Request::Located`] holds a boxed
//! [`Request`]) would let a sender stack envelopes until the receiver's stack overflows. The
//! recursive field deserializes through [`located`], which counts how deep the decoder is and
//! refuses a level past [`MAX_NESTING`] before reading any of it; [`super::decode`] then reports
//! [`super::FrameError::TooDeep`] instead of postcard's message-less custom error.
//!
//! The count is thread local: deserialization is synchronous, so one decode runs on one thread
//! from start to end, and a guard puts the count back however the decode ends.

use std::cell::Cell;

use serde::{Deserialize, Deserializer, de::Error as _};

use super::messages::Request;

/// Most envelopes one message may nest: a located request carries one plain request.
pub const MAX_NESTING: u32 = 1;

thread_local! {
    /// Envelopes the decoder on this thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Whether the decoder on this thread refused a level since [`take_refused`] last ran.
    static REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// Puts the depth back when a level ends, whether it decoded or failed.
struct Level;

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Deserializes the request inside a [`Request::Located`], refusing it without reading it when
/// the decoder already is [`MAX_NESTING`] envelopes deep.
pub(super) fn located<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Box<Request>, D::Error> {
    let depth = DEPTH.with(|d| d.get());
    if depth >= MAX_NESTING {
        REFUSED.with(|r| r.set(true));
        return Err(D::Error::custom(format_args!(
            "a located request may not carry another located request (more than {MAX_NESTING} envelope)"
        )));
    }
    DEPTH.with(|d| d.set(depth + 1));
    let _level = Level;
    Request::deserialize(deserializer).map(Box::new)
}

/// Whether a decode on this thread refused a level since the last call; clears the mark.
pub(super) fn take_refused() -> bool {
    REFUSED.with(|r| r.replace(false))
}
