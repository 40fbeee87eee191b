//! Read repair: when the replicas a read asked answered differently, the coordinator writes
//! what each owner among them lacked back to it, off the read path. Repairs wait in a bounded
//! queue ([`super::state::ReadRepairs`], `[repair] read_repair_queue` entries of at most
//! [`super::state::MAX_REPAIR_POINTS`] points each); when it is full, the repair is dropped
//! and counted, and anti-entropy repairs the block later. One task sends them ([`run`]); stores are idempotent,
//! so a repair sent twice, or racing a hint, is harmless.

use std::sync::Arc;

use timeshard_proto::wire::{Limits, Response};
use timeshard_store::Store;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::state::{Counters, RepairState};
use crate::dht::Dht;
use crate::hints::HintPayload;
use crate::hints::replay::requests;

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
            biased;
            _ = stop.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let ok = if repair.target.id == me {
            let store = store.clone();
            let block = repair.block;
            matches!(timeshard_clock::spawn_blocking(move || store.write(&[block])).await, Ok(Ok(_)))
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
