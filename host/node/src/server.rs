//! Serving requests: the accept loop, one task per connection and per stream, admitted per
//! caller ([`crate::admission`]: connections per identity, request slots apart for peers and
//! clients), request frames charged to the memory budget as they are read, answers given up
//! when their caller does not take them in time, and the dispatch of each request to the DHT,
//! the local replica ([`crate::replica`]), the coordinator or repair.

use std::net::SocketAddr;
use std::sync::Arc;

use quinn::{Connection, Incoming, RecvStream, SendStream, VarInt};
use timeshard_proto::window::Grid;
use timeshard_proto::wire::{self, ErrorCode, ErrorReply, FrameError, Request, Response};
use timeshard_sdk::tls::PeerIdentity;
use timeshard_sdk::transport::{self, CallError, STOP_LIMIT};
use tracing::{debug, info, warn};

use crate::admission::{CLOSE_TOO_MANY, Caller};
use crate::audit::Door;
use crate::handshakes::Verdict;
use crate::net::CLOSE_REVOKED;
use crate::node::Node;
use crate::peer_scope::{self, Checked};

/// Accepts connections until the node shuts down.
pub async fn accept_loop(node: Arc<Node>) {
    let shutdown = node.shutdown_signal().clone();
    loop {
        let incoming = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            incoming = node.net().endpoint().accept() => match incoming {
                Some(i) => i,
                None => return,
            },
        };
        admit_handshake(&node, incoming);
    }
}

/// Asks the per-address handshake limit about a new connection before any crypto: goes on
/// with it (one task each), asks its client to prove its address (a Retry), or refuses it.
fn admit_handshake(node: &Arc<Node>, incoming: Incoming) {
    let remote = incoming.remote_address();
    let now = tokio::time::Instant::now().into_std();
    let verdict = node.handshakes().check(remote.ip(), incoming.remote_address_validated(), incoming.may_retry(), now);
    match verdict {
        Verdict::Accept => {
            let node2 = node.clone();
            node.tasks().spawn(async move { handle_connection(node2, incoming).await });
        }
        // Under a flood from one address, about 1 in 25,000 clients sent a Retry failed only at
        // their idle timeout (none with a refusal instead); see README, `bench hostile`.
        Verdict::Retry => match incoming.retry() {
            Ok(()) => {}
            Err(e) => e.into_incoming().refuse(),
        },
        Verdict::Refuse => {
            debug!(%remote, "refused a handshake: over [limits] handshakes_per_sec_per_address");
            incoming.refuse();
        }
    }
}

async fn handle_connection(node: Arc<Node>, incoming: Incoming) {
    let remote = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => return debug!(%remote, error = %e, "refused connection"),
    };
    let conn = match tokio::time::timeout(node.config().dht.connect_timeout, connecting).await {
        Ok(Ok(c)) => c,
        // Most often a peer without a certificate from our CA.
        Ok(Err(e)) => return node.metrics().audit().failed(Door::Quic, remote, &format!("handshake failed: {e}")),
        Err(_) => return debug!(%remote, "handshake timed out"),
    };
    let Some(peer) = PeerIdentity::of_connection(&conn) else {
        conn.close(VarInt::from_u32(2), b"certificate unreadable");
        return;
    };
    if node.net().is_revoked(&peer.id) {
        node.metrics().audit().failed(Door::Quic, remote, &format!("certificate of {} is revoked", peer.id));
        conn.close(VarInt::from_u32(CLOSE_REVOKED), b"certificate revoked");
        return;
    }
    if peer.is_node && node.is_cut_off(Some(&peer.id), remote) {
        conn.close(VarInt::from_u32(crate::faults::CLOSE_CUT_OFF), b"cut off by the fault file");
        return;
    }
    // Held while the connection is served.
    let _admitted = match node.connections().admit(peer.id) {
        Ok(slot) => slot,
        Err(e) => {
            debug!(%remote, peer = %peer.id, error = %e, "refused a connection");
            conn.close(VarInt::from_u32(CLOSE_TOO_MANY), e.to_string().as_bytes());
            return;
        }
    };
    node.net().grant_window(&conn, peer.is_node);
    if peer.is_node {
        node.net().adopt(&conn);
        node.dht().observe_incoming(peer, remote);
    }
    serve_connection(node, conn, peer).await;
}

/// Answers the requests a peer sends over a connection this node dialed.
pub fn serve_dialed(node: &Arc<Node>, conn: Connection) {
    let Some(peer) = PeerIdentity::of_connection(&conn) else { return };
    let node2 = node.clone();
    node.tasks().spawn(async move { serve_connection(node2, conn, peer).await });
}

async fn serve_connection(node: Arc<Node>, conn: Connection, peer: PeerIdentity) {
    let remote = conn.remote_address();
    let shutdown = node.shutdown_signal().clone();
    let mut revocations = node.net().revocations();
    loop {
        if revocations.borrow_and_update().contains(&peer.id) {
            info!(%remote, peer = %peer.id, "closed a connection: its certificate was revoked");
            conn.close(VarInt::from_u32(CLOSE_REVOKED), b"certificate revoked");
            return;
        }
        let (send, recv) = tokio::select! {
            biased;
            // Stop taking new requests; the node closes the connection once those in flight end.
            _ = shutdown.cancelled() => return,
            // Checked at the top of the loop.
            Ok(()) = revocations.changed() => continue,
            stream = conn.accept_bi() => match stream {
                Ok(s) => s,
                Err(_) => return, // closed by the peer or timed out
            },
        };
        let node = node.clone();
        node.tasks().clone().spawn(async move { serve_stream(node, peer, remote, send, recv).await });
    }
}

/// Writes `resp` on `send`. A caller has `[dht] request_timeout` to take the answer, as it had to
/// send its request: one that stops reading would otherwise hold the write back on QUIC flow
/// control forever, and with it a request slot and the answer's memory. Past it the stream is
/// reset and the answer counted as abandoned.
async fn respond(node: &Node, send: &mut SendStream, resp: &Response, limit: u32) {
    let write = async {
        match transport::write_frame(send, resp, limit).await {
            Err(CallError::Frame(FrameError::TooLarge { len, limit })) => {
                let e = ErrorReply::new(
                    ErrorCode::Internal,
                    format!("the answer is {len} bytes, over the {limit}-byte message limit; ask for a smaller page"),
                );
                transport::write_frame(send, &Response::Error(e), limit).await
            }
            other => other,
        }
    };
    match tokio::time::timeout(node.config().dht.request_timeout, write).await {
        Ok(Ok(n)) => node.net().traffic().sent(n),
        Ok(Err(e)) => debug!(error = %e, "could not send a response"),
        Err(_) => crate::streams::abandon(node, send),
    }
}

async fn serve_stream(
    node: Arc<Node>,
    peer: PeerIdentity,
    remote: SocketAddr,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let limit = node.limits().max_message_bytes;
    if peer.is_node && node.is_cut_off(Some(&peer.id), remote) {
        // A partition: the request goes unanswered.
        let _ = recv.stop(VarInt::from_u32(STOP_LIMIT));
        let _ = send.reset(VarInt::from_u32(STOP_LIMIT));
        return;
    }
    let caller = Caller::of(peer.is_node);
    let Some(_permit) = node.slots().try_admit(caller) else {
        let whose = if peer.is_node { "peers" } else { "clients" };
        let e = ErrorReply::new(
            ErrorCode::Overloaded,
            format!("the node is serving its maximum number of requests from {whose}; retry shortly"),
        );
        return respond(&node, &mut send, &Response::Error(e), limit).await;
    };
    // The frame's bytes are charged as its buffer grows, and given back once it is decoded.
    let mut charge = node.coordinator().budget().map(|ledger| ledger.frame(peer.is_node));
    let read = transport::read_frame(&mut recv, limit, |bytes| match charge.as_mut() {
        Some(charge) => charge.grow(bytes as u64).map_err(ErrorReply::from),
        None => Ok(()),
    });
    let body = match tokio::time::timeout(node.config().dht.request_timeout, read).await {
        Ok(Ok(b)) => {
            node.net().traffic().received(wire::HEADER_BYTES + b.len());
            b
        }
        Ok(Err(CallError::Frame(e @ FrameError::TooLarge { .. }))) => {
            let _ = recv.stop(VarInt::from_u32(STOP_LIMIT));
            return respond(
                &node,
                &mut send,
                &Response::Error(ErrorReply::new(ErrorCode::TooLarge, e.to_string())),
                limit,
            )
            .await;
        }
        Ok(Err(CallError::Budget(e))) => {
            let _ = recv.stop(VarInt::from_u32(STOP_LIMIT));
            return respond(&node, &mut send, &Response::Error(e), limit).await;
        }
        Ok(Err(e)) => return debug!(%remote, error = %e, "could not read a request"),
        Err(_) => return debug!(%remote, "request not received in time"),
    };
    let decoded = wire::decode::<Request>(&body);
    drop((body, charge));
    let resp = match decoded {
        Err(e) => Response::Error(ErrorReply::new(ErrorCode::Malformed, format!("cannot decode the request: {e}"))),
        Ok(req) => {
            if peer.is_node {
                node.dht().observe_incoming(peer, remote);
            }
            if crate::streams::is_streamed(&req) {
                return crate::streams::serve(&node, peer, req, send).await;
            }
            if let Request::Gossip { .. } = req {
                let from = timeshard_proto::Contact { id: peer.id, addr: remote };
                handle_gossip(&node, peer, from, req)
            } else {
                handle(&node, peer, req).await
            }
        }
    };
    respond(&node, &mut send, &resp, limit).await;
}

/// Stores and registrations from another node only where placement gives them to this node
/// or to the asker ([`crate::peer_scope`]); refusals are counted and logged.
fn check_placement(node: &Node, peer: PeerIdentity, req: &Request) -> Result<(), ErrorReply> {
    let me = node.dht().me().id;
    if !peer.is_node || peer.id == me {
        return Ok(());
    }
    // The class table is read only for the requests checked here, not for every peer request.
    let view = node.view();
    let (kind, checked) = match req {
        Request::Store { blocks } => {
            (Checked::Store, peer_scope::check_store(view, &node.coordinator().classes(), me, peer.id, blocks))
        }
        Request::RegisterSeries { series } => {
            let classes = node.coordinator().classes();
            (Checked::RegisterSeries, peer_scope::check_registrations(view, &classes, me, peer.id, series))
        }
        _ => return Ok(()),
    };
    if let Err(e) = &checked {
        node.repair().refusals().add(kind);
        warn!(peer = %peer.id.short(), error = %e.message, "refused a peer request");
    }
    checked
}

/// Whether this node's answer to `req` may say settled: false for a strict in-CoI read from
/// another node whose view counts this node as an in-CoI owner while this node's own view does
/// not ([`peer_scope::vouches_in_coi`]).
pub(crate) fn in_coi_vouch(node: &Node, peer: PeerIdentity, req: &Request) -> bool {
    let me = node.dht().me().id;
    match peer_scope::asked_in_coi(req) {
        Some((series, base, quanta)) if peer.id != me => {
            peer_scope::vouches_in_coi(node.view(), &node.coordinator().classes(), me, series, base, &quanta)
        }
        _ => true,
    }
}

/// Validates and answers one request, counting client writes and queries for `/metrics`.
pub async fn handle(node: &Arc<Node>, peer: PeerIdentity, req: Request) -> Response {
    let started = std::time::Instant::now();
    let (req, client_at) = match req.into_located() {
        Ok(r) => r,
        Err(e) => return Response::Error(e.into()),
    };
    let counted = crate::metrics::Counted::of(&req);
    let resp = crate::coordinator::client_at::scope(client_at, answer(node, peer, req)).await;
    if let Some(counted) = counted {
        node.metrics().record_quic(counted, &resp, started.elapsed());
    }
    resp
}

async fn answer(node: &Arc<Node>, peer: PeerIdentity, req: Request) -> Response {
    if let Err(e) = req.validate(&node.limits()) {
        return Response::Error(e.into());
    }
    if req.is_peer_only() && !peer.is_node {
        return Response::Error(ErrorReply::new(
            ErrorCode::Forbidden,
            format!("{} requests are for nodes; this certificate is a client's", req.kind()),
        ));
    }
    if let Err(e) = check_placement(node, peer, &req) {
        return Response::Error(e);
    }
    match req {
        Request::Ping => Response::Pong { id: node.dht().me().id },
        Request::FindNode { target } => {
            let max = node.limits().max_contacts as usize;
            Response::Nodes { closest: node.dht().closest_known(&target, node.config().dht.k.min(max)) }
        }
        req @ (Request::FetchParts { .. } | Request::ReadStream { .. }) => Response::Error(ErrorReply::new(
            ErrorCode::Internal,
            format!("{} is answered as a stream where the stream is read", req.kind()),
        )),
        req @ (Request::Store { .. }
        | Request::Fetch { .. }
        | Request::RegisterSeries { .. }
        | Request::HasSeries { .. }
        | Request::FetchWindows { .. }
        | Request::FindSeries { .. }
        | Request::Summarize { .. }) => {
            let vouches = in_coi_vouch(node, peer, &req);
            let mut resp = node.replica().serve(req).await;
            if !vouches {
                peer_scope::unsettle(&mut resp);
            }
            resp
        }
        Request::Write { batch } => {
            let batch = match wire::check_write(batch) {
                Ok(b) => b,
                Err(e) => return Response::Error(e.into()),
            };
            match node.coordinator().write(batch).await {
                Ok(w) => Response::Written {
                    points: w.points,
                    blocks: w.blocks,
                    rejected: w.rejected,
                    rejections: w.rejections,
                },
                Err(e) => Response::Error(e),
            }
        }
        Request::Read { series, start, end, after, limit } => {
            let (series, range) = match wire::check_read(&series, start, end) {
                Ok(r) => r,
                Err(e) => return Response::Error(e.into()),
            };
            match node.coordinator().read(series, range, after, limit).await {
                Ok((points, next)) => Response::Page { points, next },
                Err(e) => Response::Error(e),
            }
        }
        Request::Aggregate { series, start, end, width_ns } => {
            let (series, range) = match wire::check_aggregate(&series, start, end, width_ns) {
                Ok(r) => r,
                Err(e) => return Response::Error(e.into()),
            };
            match node.coordinator().aggregate(series, range, Grid::epoch(width_ns)).await {
                Ok(windows) => Response::Windows { windows },
                Err(e) => Response::Error(e),
            }
        }
        Request::ListSeries { filter, limit } => match node.coordinator().list_series(filter, limit).await {
            Ok((series, more)) => Response::SeriesList { series, more },
            Err(e) => Response::Error(e),
        },
        Request::Query { series, start, end, policy, params } => {
            let (series, range) = match wire::check_read(&series, start, end) {
                Ok(r) => r,
                Err(e) => return Response::Error(e.into()),
            };
            match node.coordinator().query(series, range, policy, params).await {
                Ok(out) => Response::QueryResult(out),
                Err(e) => Response::Error(e),
            }
        }
        Request::Status => Response::Status(Box::new(node.status())),
        req @ (Request::RepairTree { .. }
        | Request::RepairLeaves { .. }
        | Request::ReadBlocks { .. }
        | Request::BlockDigests { .. }
        | Request::ListBlocks { .. }) => node.repair().serve(peer.id, req).await,
        Request::Leave => {
            // Only the holder of this node's key may make it leave.
            if peer.id != node.dht().me().id {
                return Response::Error(ErrorReply::new(
                    ErrorCode::Forbidden,
                    "only the node's own certificate may make it leave; connect with the node's certificate and key",
                ));
            }
            let stopper = node.clone();
            let gossip = node.config().membership.gossip_interval;
            Response::Leaving(node.repair().leave(gossip, move || stopper.stop("left the cluster".into())))
        }
        // Tier hook: `timeshard archive status`.
        Request::ArchiveStatus => Response::Archive(Box::new(node.tier().report().await)),
        Request::Latest { series, before } => {
            let series = match wire::check_read(&series, before.saturating_sub(1), before) {
                Ok((series, _)) => series,
                Err(e) => return Response::Error(e.into()),
            };
            match node.coordinator().latest(series, before).await {
                Ok(point) => Response::Latest { point },
                Err(e) => Response::Error(e),
            }
        }
        // Unwrapped by `handle` (the envelope cannot nest).
        Request::Located { .. } => {
            Response::Error(ErrorReply::new(ErrorCode::Malformed, "a located request cannot carry another one"))
        }
        // Served by `handle_gossip`, which knows where the peer spoke from.
        Request::Gossip { .. } => {
            Response::Error(ErrorReply::new(ErrorCode::Internal, "gossip is answered where the stream is read"))
        }
    }
}

/// Answers a peer's gossip: entries naming no reachable address are given the one `from` spoke
/// from, or the routing table's.
fn handle_gossip(node: &Arc<Node>, peer: PeerIdentity, from: timeshard_proto::Contact, req: Request) -> Response {
    if let Err(e) = req.validate(&node.limits()) {
        return Response::Error(e.into());
    }
    if !peer.is_node {
        return Response::Error(ErrorReply::new(
            ErrorCode::Forbidden,
            "gossip requests are for nodes; this certificate is a client's",
        ));
    }
    let Request::Gossip { digest, entries, revocations } = req else {
        return Response::Error(ErrorReply::new(ErrorCode::Internal, "not a gossip request"));
    };
    let dht = node.dht();
    let known = |id: &timeshard_proto::Id| dht.closest_known(id, 1).into_iter().find(|c| c.id == *id).map(|c| c.addr);
    node.view().on_gossip(from, digest, entries, revocations, known)
}
