//! A replica's streamed answer to a [`Request::FetchParts`]: the points or digests of many
//! block parts of one series, paged into frames. The store is read off the async threads and
//! the frames go through a channel of [`FRAMES_AHEAD`] frames, so a slow reader (QUIC flow
//! control, or the coordinator's merge) holds the producer back instead of letting frames pile
//! up.
//!
//! [`Request::FetchParts`]: timeshard_proto::wire::Request::FetchParts

use std::sync::Arc;

use timeshard_proto::packed::PackedColumns;
use timeshard_proto::stream::{FetchPart, PartChunk, PartEnd};
use timeshard_proto::wire::{ErrorCode, ErrorReply};
use timeshard_proto::{Point, SeriesKey};
use timeshard_store::{Store, StoreError};
use tokio::sync::mpsc;

/// Frames a producer may run ahead of the writer.
pub const FRAMES_AHEAD: usize = 2;

/// One frame of a replica's answer to a `FetchParts` request: its chunks, whether the replica
/// is settled, and whether frames follow.
#[derive(Debug)]
pub struct PartPages {
    pub chunks: Vec<PartChunk>,
    pub settled: bool,
    pub more: bool,
}

/// A frame of a replica's answer, or why the answer stopped.
pub type PartFrame = Result<PartPages, ErrorReply>;

/// The error a replica answers when its store failed: unavailable when it is full or cannot be
/// reached (another replica may do), a storage error otherwise.
pub(super) fn store_error(e: StoreError) -> ErrorReply {
    let code = match e {
        StoreError::Full(_) | StoreError::Unavailable(_) => ErrorCode::Unavailable,
        _ => ErrorCode::Storage,
    };
    ErrorReply::new(code, format!("this node's store failed: {e}"))
}

/// Reads `parts` of `series` from `store` (blocking) and sends them to `tx` in frames of at
/// most about `page_points` points: the points of the parts that ask for them, the count and
/// digest of every part on its last chunk. The last frame says `more: false`; a store failure
/// ends the stream with an error. Every frame carries `settled`.
pub fn produce_parts(
    store: &Arc<dyn Store>,
    series: &SeriesKey,
    parts: &[FetchPart],
    page_points: usize,
    settled: bool,
    tx: &mpsc::Sender<PartFrame>,
) {
    let page_points = page_points.max(1);
    let mut frame: Vec<PartChunk> = Vec::new();
    let mut in_frame = 0usize;
    for (i, fp) in parts.iter().enumerate() {
        let whole = match whole_block(store, series, fp, page_points) {
            Ok(w) => w,
            Err(e) => {
                let _ = tx.blocking_send(Err(store_error(e)));
                return;
            }
        };
        if let Some((end, packed)) = whole {
            if in_frame > 0 && in_frame + end.count as usize > page_points {
                if tx.blocking_send(Ok(PartPages { chunks: std::mem::take(&mut frame), settled, more: true })).is_err()
                {
                    return;
                }
                in_frame = 0;
            }
            in_frame += (end.count as usize).max(1);
            frame.push(PartChunk { part: i as u32, points: Vec::new(), packed, end: Some(end) });
            continue;
        }
        let mut after = None;
        let mut end = PartEnd { count: 0, digest: 0 };
        loop {
            let page = match store.read(series, fp.part.range, after, page_points) {
                Ok(p) => p,
                Err(e) => {
                    let _ = tx.blocking_send(Err(store_error(e)));
                    return;
                }
            };
            end.add(&page.points);
            after = page.points.last().map(Point::key).or(after);
            let last = !page.more;
            let points = if fp.points { page.points } else { Vec::new() };
            if in_frame > 0 && in_frame + points.len() > page_points {
                if tx.blocking_send(Ok(PartPages { chunks: std::mem::take(&mut frame), settled, more: true })).is_err()
                {
                    return;
                }
                in_frame = 0;
            }
            // A digest-only chunk costs about as much as a point on the wire.
            in_frame += points.len().max(1);
            if !points.is_empty() || last {
                frame.push(PartChunk { part: i as u32, points, packed: None, end: last.then_some(end) });
            }
            if last {
                break;
            }
        }
    }
    let _ = tx.blocking_send(Ok(PartPages { chunks: frame, settled, more: false }));
}

/// A part that covers its block's quantum whole, answered without decoding a point: the
/// block's sealed columns when the part's points are asked for (if it is held as one sealed
/// frame of at most a page, so a frame stays within the message limit), or only its count and
/// digest from memory. `None`: read the part's points.
fn whole_block(
    store: &Arc<dyn Store>,
    series: &SeriesKey,
    fp: &FetchPart,
    page_points: usize,
) -> Result<Option<(PartEnd, Option<PackedColumns>)>, StoreError> {
    let FetchPart { part, points } = fp;
    if part.range != part.quantum.range() {
        return Ok(None);
    }
    if *points {
        return Ok(store
            .read_packed(series, part.quantum.start, page_points as u64)?
            .map(|b| (PartEnd { count: b.count, digest: b.digest }, Some(b.columns))));
    }
    // An empty block is not held; a count or digest that is briefly off (see
    // `Store::list_blocks`) only sends the part the careful way.
    let info = store.block_info(series, part.quantum.start)?;
    Ok(Some((info.map_or(PartEnd { count: 0, digest: 0 }, |b| PartEnd { count: b.count, digest: b.digest }), None)))
}
