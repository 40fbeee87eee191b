//! The local replica's side of every request a coordinator sends to the replicas of a block:
//! storing blocks and registering series (`Store`, `RegisterSeries`), reading points and
//! whether a series is known (`Fetch`, `HasSeries`), window aggregates (`FetchWindows`), query
//! policies over its parts (`Summarize`), series listings (`FindSeries`), and the streamed
//! parts of a read (`FetchParts`, [`parts`]).
//!
//! One room, two callers: the request server answers peers with it, and the coordinator calls
//! it directly when a replica is this node (no network). Every answer comes from the node's
//! store (with an archive: hot and cold merged), off the async threads since stores may block on
//! disk. Read answers carry `settled`: whether this node holds every block it owns (see
//! [`RepairState`]). Repair sessions between replicas are answered by the repair module's
//! `serve`, which needs the repair's inventory.

pub mod parts;

use std::sync::Arc;

use timeshard_policy::Registry;
use timeshard_proto::SeriesKey;
use timeshard_proto::stream::FetchPart;
use timeshard_proto::wire::{ErrorCode, ErrorReply, Request, Response};
use timeshard_store::{Store, StoreError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::policies;
use crate::repair::state::RepairState;
use crate::storage::StoreUse;
pub use parts::{FRAMES_AHEAD, PartFrame, PartPages};

/// The local replica: the store it answers from, whether it is settled, and the policies its
/// query partials run.
#[derive(Clone, Debug)]
pub struct Replica {
    store: Arc<dyn Store>,
    usage: Arc<StoreUse>,
    repair: Arc<RepairState>,
    policies: Option<Arc<Registry>>,
}

impl Replica {
    /// The replica answering from `store` (refusing writes while `usage` is at its limit),
    /// settled as `repair` says, running `policies`.
    pub fn new(
        store: Arc<dyn Store>,
        usage: Arc<StoreUse>,
        repair: Arc<RepairState>,
        policies: Option<Arc<Registry>>,
    ) -> Replica {
        Replica { store, usage, repair, policies }
    }

    /// The store's use against `[store] max_bytes`.
    pub fn usage(&self) -> &Arc<StoreUse> {
        &self.usage
    }

    /// The store the replica answers from.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Answers a replica request: `Store`, `Fetch`, `FetchWindows`, `FindSeries`,
    /// `RegisterSeries`, `HasSeries` or `Summarize` (anything else is refused as internal).
    pub async fn serve(&self, req: Request) -> Response {
        if let Request::Store { blocks } = &req {
            if let Some(why) = self.usage.refusal(blocks) {
                return Response::Error(ErrorReply::new(ErrorCode::Unavailable, why));
            }
            // Counted before the write: one that fails counts until the next measure only.
            self.usage.note_written(blocks);
        }
        match req {
            req @ Request::Summarize { .. } => self.summarize(req).await,
            req => serve_store(&self.store, req, self.repair.is_settled()).await,
        }
    }

    /// Answers a peer's request to run a query policy over this node's parts of some blocks.
    async fn summarize(&self, req: Request) -> Response {
        let Request::Summarize { series, parts, policy, params, .. } = req else {
            return Response::Error(ErrorReply::new(ErrorCode::Internal, "not a summarize request"));
        };
        let registry = match policies::required(self.policies.as_ref()) {
            Ok(r) => r,
            Err(e) => return Response::Error(e),
        };
        let params = params.into_iter().collect();
        match policies::summarize(self.store.clone(), registry, series, parts, policy, params).await {
            Ok(parts) => Response::Partials { parts, settled: self.repair.is_settled() },
            Err(e) => Response::Error(e),
        }
    }

    /// Starts answering a `FetchParts` request: `parts` of `series` in frames of about
    /// `page_points` points ([`parts::produce_parts`]), read on a blocking thread. The frames
    /// arrive on the returned channel; the task ends once the last is taken or the channel is
    /// dropped.
    pub fn fetch_parts(
        &self,
        series: SeriesKey,
        parts: Vec<FetchPart>,
        page_points: usize,
    ) -> (mpsc::Receiver<PartFrame>, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(FRAMES_AHEAD);
        let store = self.store.clone();
        let settled = self.repair.is_settled();
        let producer = timeshard_clock::spawn_blocking(move || {
            parts::produce_parts(&store, &series, &parts, page_points, settled, &tx);
        });
        (rx, producer)
    }
}

fn storage_error(e: StoreError) -> Response {
    warn!(error = %e, "store failed");
    Response::Error(parts::store_error(e))
}

/// Serves a store request from `store` on a blocking thread; read answers carry `settled`.
async fn serve_store(store: &Arc<dyn Store>, req: Request, settled: bool) -> Response {
    let store = store.clone();
    let work = timeshard_clock::spawn_blocking(move || match req {
        Request::Store { blocks } => match store.write(&blocks) {
            Ok(_) => Response::Stored { points: blocks.iter().map(|b| b.points.len() as u64).sum() },
            Err(e) => storage_error(e),
        },
        Request::Fetch { series, range, after, limit, .. } => match store.read(&series, range, after, limit as usize) {
            Ok(page) => Response::Points { points: page.points, more: page.more, settled },
            Err(e) => storage_error(e),
        },
        Request::FetchWindows { series, parts, grid, .. } => {
            match parts.iter().map(|p| store.aggregate(&series, p.range, grid)).collect() {
                Ok(parts) => Response::BlockWindows { parts, settled },
                Err(e) => storage_error(e),
            }
        }
        Request::FindSeries { filter, limit } => match store.find_series_page(&filter, limit as usize) {
            Ok((series, more)) => Response::SeriesList { series, more },
            Err(e) => storage_error(e),
        },
        Request::RegisterSeries { series } => match store.register_series(&series) {
            Ok(()) => Response::Stored { points: 0 },
            Err(e) => storage_error(e),
        },
        Request::HasSeries { series } => match store.has_series(&series) {
            Ok(known) => Response::SeriesKnown { known },
            Err(e) => storage_error(e),
        },
        other => {
            Response::Error(ErrorReply::new(ErrorCode::Internal, format!("{} is not a replica request", other.kind())))
        }
    });
    work.await
        .unwrap_or_else(|e| Response::Error(ErrorReply::new(ErrorCode::Internal, format!("store task failed: {e}"))))
}
