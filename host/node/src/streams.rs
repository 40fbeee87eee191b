//! Requests answered with a stream of frames on one QUIC stream: a replica's answer to a
//! [`Request::FetchParts`] (the points or digests of many block parts, paged) and a client's
//! [`Request::ReadStream`] (a whole range as column batches).
//!
//! Producers run apart from the writer: the store is read off the async threads and the
//! coordinator merges in its own task; both hand frames to the writer through a channel of
//! [`FRAMES_AHEAD`] frames, and the writer waits on QUIC flow control, so a slow reader holds
//! the producer back instead of letting frames pile up.

use std::sync::Arc;

use quinn::SendStream;
use timeshard_proto::packed::PackedColumns;
use timeshard_proto::stream::{FetchPart, PartChunk, PartEnd};
use timeshard_proto::wire::{self, ErrorCode, ErrorReply, Request, Response};
use timeshard_proto::{Point, SeriesKey};
use timeshard_sdk::transport;
use timeshard_store::{Store, StoreError};
use tokio::sync::mpsc;
use tracing::debug;

use crate::node::Node;

/// Frames a producer may run ahead of the writer.
pub const FRAMES_AHEAD: usize = 2;

/// One frame of a replica's answer to a [`Request::FetchParts`]: its chunks, whether the
/// replica is settled, and whether frames follow.
#[derive(Debug)]
pub struct PartPages {
    pub chunks: Vec<PartChunk>,
    pub settled: bool,
    pub more: bool,
}

/// A frame of a replica's answer, or why the answer stopped.
pub type PartFrame = Result<PartPages, ErrorReply>;

/// Whether `req` is answered with a stream of frames.
pub fn is_streamed(req: &Request) -> bool {
    match req {
        Request::Located { request, .. } => is_streamed(request),
        req => matches!(req, Request::FetchParts { .. } | Request::ReadStream { .. }),
    }
}

fn store_error(e: StoreError) -> ErrorReply {
    let code = match e {
        StoreError::Full(_) | StoreError::Unavailable(_) => ErrorCode::Unavailable,
        _ => ErrorCode::Storage,
    };
    ErrorReply::new(code, format!("this node's store failed: {e}"))
}

/// Reads `parts` of `series` from `store` (blocking) and sends them to `tx` in frames of at
/// most about `page_points` points: the points of the parts that ask for them, the count and
/// digest of every part on its last chunk. The last frame says `more: false`; a store failure ends the stream with an error. Every frame carries `settled`.
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

/// Answers a streamed request on `send`, after the checks every request gets.
pub async fn serve(node: &Arc<Node>, peer_is_node: bool, req: Request, mut send: SendStream) {
    let limit = node.limits().max_message_bytes;
    if let Err(e) = req.validate(&node.limits()) {
        return finish_with(node, &mut send, &Response::Error(e.into()), limit).await;
    }
    let (req, client_at) = match req.into_located() {
        Ok(r) => r,
        Err(e) => return finish_with(node, &mut send, &Response::Error(e.into()), limit).await,
    };
    if req.is_peer_only() && !peer_is_node {
        let e = ErrorReply::new(
            ErrorCode::Forbidden,
            format!("{} requests are for nodes; this certificate is a client's", req.kind()),
        );
        return finish_with(node, &mut send, &Response::Error(e), limit).await;
    }
    match req {
        Request::FetchParts { series, parts, page_points } => {
            let (tx, mut rx) = mpsc::channel(FRAMES_AHEAD);
            let store = node.store().clone();
            let settled = node.repair().state().is_settled();
            let producer = tokio::task::spawn_blocking(move || {
                produce_parts(&store, &series, &parts, page_points as usize, settled, &tx);
            });
            while let Some(frame) = rx.recv().await {
                let resp = match frame {
                    Ok(PartPages { chunks, settled, more }) => Response::PartPages { chunks, settled, more },
                    Err(e) => Response::Error(e),
                };
                let end = !matches!(resp, Response::PartPages { more: true, .. });
                if !send_frame(node, &mut send, &resp, limit).await || end {
                    break;
                }
            }
            drop(rx);
            let _ = producer.await;
        }
        Request::ReadStream { series, start, end, after, batch_points } => {
            let (series, range) = match wire::check_read(&series, start, end) {
                Ok(r) => r,
                Err(e) => return finish_with(node, &mut send, &Response::Error(e.into()), limit).await,
            };
            let (tx, mut rx) = mpsc::channel(FRAMES_AHEAD);
            let coordinator = node.coordinator().clone();
            let read = coordinator.read_stream(series, range, after, batch_points as usize, tx);
            let mut reading = Some(tokio::spawn(crate::coordinator::client_at::scope(client_at, read)));
            loop {
                let resp = match rx.recv().await {
                    Some(Ok(runs)) => Response::Batch { runs, more: true },
                    Some(Err(e)) => Response::Error(e),
                    // The read ended: completely, unless its task failed.
                    None => match reading.take() {
                        Some(t) => match t.await {
                            Ok(()) => Response::Batch { runs: Vec::new(), more: false },
                            Err(e) => {
                                Response::Error(ErrorReply::new(ErrorCode::Internal, format!("read failed: {e}")))
                            }
                        },
                        None => break,
                    },
                };
                let end = !matches!(resp, Response::Batch { more: true, .. });
                if !send_frame(node, &mut send, &resp, limit).await || end {
                    break;
                }
            }
            drop(rx);
            if let Some(t) = reading {
                let _ = t.await;
            }
        }
        other => {
            let e = ErrorReply::new(ErrorCode::Internal, format!("{} is not answered as a stream", other.kind()));
            send_frame(node, &mut send, &Response::Error(e), limit).await;
        }
    }
    let _ = send.finish();
}

async fn send_frame(node: &Node, send: &mut SendStream, resp: &Response, limit: u32) -> bool {
    match transport::write_frame_open(send, resp, limit).await {
        Ok(n) => {
            node.net().traffic().sent(n);
            true
        }
        Err(e) => {
            debug!(error = %e, "could not send a streamed frame");
            false
        }
    }
}

async fn finish_with(node: &Node, send: &mut SendStream, resp: &Response, limit: u32) {
    send_frame(node, send, resp, limit).await;
    let _ = send.finish();
}
