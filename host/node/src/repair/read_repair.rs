//! Read repair: when the replicas a read asked answered differently, the coordinator writes
//! what each owner among them lacked back to it, off the read path. Repairs wait in a bounded
//! queue ([`ReadRepairs`], `[repair] read_repair_queue` entries of at most
//! [`MAX_REPAIR_POINTS`] points each); when it is full, the repair is dropped and counted, and
//! anti-entropy repairs the block later. One task sends them ([`run`]); stores are idempotent,
//! so a repair sent twice, or racing a hint, is harmless.

use std::sync::{Arc, Mutex};

use timeshard_proto::Contact;
use timeshard_proto::wire::{BlockPoints, Limits, Response};
use timeshard_store::Store;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{Counters, RepairState};
use crate::dht::Dht;
use crate::hints::HintPayload;
use crate::hints::replay::requests;

/// Most points one queued repair carries; a replica lacking more gets the first ones now and
/// the rest from a later read or anti-entropy.
pub const MAX_REPAIR_POINTS: usize = 4_096;

/// What one replica lacked of one block.
#[derive(Debug)]
pub struct ReadRepair {
    pub target: Contact,
    pub block: BlockPoints,
}

/// The queue of read repairs.
#[derive(Debug)]
pub struct ReadRepairs {
    tx: mpsc::Sender<ReadRepair>,
    rx: Mutex<Option<mpsc::Receiver<ReadRepair>>>,
}

impl ReadRepairs {
    /// A queue of at most `capacity` repairs.
    pub fn new(capacity: usize) -> ReadRepairs {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        ReadRepairs { tx, rx: Mutex::new(Some(rx)) }
    }

    /// The receiving end, for the task that sends repairs (once).
    pub fn take_receiver(&self) -> Option<mpsc::Receiver<ReadRepair>> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Queues `repair`; returns false (and it is dropped) when the queue is full.
    fn offer(&self, mut repair: ReadRepair) -> bool {
        repair.block.points.truncate(MAX_REPAIR_POINTS);
        self.tx.try_send(repair).is_ok()
    }
}

impl RepairState {
    /// Queues the points `block` holds for `target`, which lacked them; counts it as dropped
    /// when the queue is full.
    pub fn read_repair(&self, target: Contact, block: BlockPoints) {
        if !self.read_repairs().offer(ReadRepair { target, block }) {
            Counters::add(&self.counters.read_repairs_dropped, 1);
        }
    }
}

/// Sends queued read repairs until `stop` fires: to peers as `Store` requests within `limits`,
/// to this node (`me`) straight into `store`.
pub async fn run(
    state: Arc<RepairState>,
    dht: Arc<Dht>,
    store: Arc<dyn Store>,
    limits: Limits,
    stop: CancellationToken,
) {
    let Some(mut rx) = state.read_repairs().take_receiver() else { return };
    let me = dht.me().id;
    loop {
        let repair = tokio::select! {
            _ = stop.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let ok = if repair.target.id == me {
            let store = store.clone();
            let block = repair.block;
            matches!(tokio::task::spawn_blocking(move || store.write(&[block])).await, Ok(Ok(_)))
        } else {
            let mut ok = true;
            for req in requests(vec![HintPayload::Blocks(vec![repair.block])], &limits) {
                match dht.call(&repair.target, &req).await {
                    Ok(Response::Stored { .. }) => {}
                    other => {
                        debug!(peer = %repair.target.id.short(), answer = ?other, "read repair failed");
                        ok = false;
                        break;
                    }
                }
            }
            ok
        };
        let counter = if ok { &state.counters.read_repairs_sent } else { &state.counters.read_repairs_dropped };
        Counters::add(counter, 1);
    }
}
