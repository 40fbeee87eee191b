//! Requests answered with a stream of frames on one QUIC stream: a replica's answer to a
//! [`Request::FetchParts`] (the points or digests of many block parts, paged: the local
//! replica produces them, [`crate::replica::parts`]) and a client's [`Request::ReadStream`] (a
//! whole range as column batches, merged by the coordinator).
//!
//! Producers run apart from the writer: the store is read off the async threads and the
//! coordinator merges in its own task; both hand frames to the writer through a channel of
//! [`FRAMES_AHEAD`] frames, and the writer waits on QUIC flow control, so a slow reader holds
//! the producer back instead of letting frames pile up; a reader that takes no frame within
//! `[dht] request_timeout` has its stream reset, which ends the producer too.

use std::sync::Arc;

use quinn::SendStream;
use timeshard_proto::wire::{self, ErrorCode, ErrorReply, Request, Response};
use timeshard_sdk::tls::PeerIdentity;
use timeshard_sdk::transport;
use tokio::sync::mpsc;
use tracing::debug;

use crate::node::Node;
use crate::replica::{FRAMES_AHEAD, PartPages};

/// Whether `req` is answered with a stream of frames.
pub fn is_streamed(req: &Request) -> bool {
    match req {
        Request::Located { request, .. } => is_streamed(request),
        req => matches!(req, Request::FetchParts { .. } | Request::ReadStream { .. }),
    }
}

/// Answers a streamed request on `send`, after the checks every request gets.
pub async fn serve(node: &Arc<Node>, peer: PeerIdentity, req: Request, mut send: SendStream) {
    let limit = node.limits().max_message_bytes;
    if let Err(e) = req.validate(&node.limits()) {
        return finish_with(node, &mut send, &Response::Error(e.into()), limit).await;
    }
    let (req, client_at) = match req.into_located() {
        Ok(r) => r,
        Err(e) => return finish_with(node, &mut send, &Response::Error(e.into()), limit).await,
    };
    if req.is_peer_only() && !peer.is_node {
        let e = ErrorReply::new(
            ErrorCode::Forbidden,
            format!("{} requests are for nodes; this certificate is a client's", req.kind()),
        );
        return finish_with(node, &mut send, &Response::Error(e), limit).await;
    }
    // Whether this replica vouches for an in-CoI read's answer (true for any other request).
    let vouches = crate::server::in_coi_vouch(node, peer, &req);
    match req {
        Request::FetchParts { series, parts, page_points, .. } => {
            let (mut rx, producer) = node.replica().fetch_parts(series, parts, page_points as usize);
            while let Some(frame) = rx.recv().await {
                let resp = match frame {
                    Ok(PartPages { chunks, settled, more }) => {
                        Response::PartPages { chunks, settled: settled && vouches, more }
                    }
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

/// Sends one frame; each has `[dht] request_timeout` to be taken, or the stream is reset
/// ([`abandon`]) and the answer ends.
async fn send_frame(node: &Node, send: &mut SendStream, resp: &Response, limit: u32) -> bool {
    let write = transport::write_frame_open(send, resp, limit);
    match tokio::time::timeout(node.config().dht.request_timeout, write).await {
        Ok(Ok(n)) => {
            node.net().traffic().sent(n);
            true
        }
        Ok(Err(e)) => {
            debug!(error = %e, "could not send a streamed frame");
            false
        }
        Err(_) => {
            abandon(node, send);
            false
        }
    }
}

async fn finish_with(node: &Node, send: &mut SendStream, resp: &Response, limit: u32) {
    send_frame(node, send, resp, limit).await;
    let _ = send.finish();
}

/// Gives up an answer (whole or streamed) its caller did not take within `[dht]
/// request_timeout`: resets its stream and counts it.
pub(crate) fn abandon(node: &Node, send: &mut SendStream) {
    let _ = send.reset(quinn::VarInt::from_u32(timeshard_sdk::transport::STOP_LIMIT));
    node.metrics().record_abandoned_answer(crate::audit::Door::Quic);
    debug!(timeout = ?node.config().dht.request_timeout, "gave up an answer its caller did not take");
}
