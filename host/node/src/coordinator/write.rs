//! The write path: ingest policies, then placing every block of a batch on its RF replicas and
//! returning once each has W acknowledgements.
//!
//! Series seen for the first time are registered in the series dictionary, and index spans
//! holding data for the first time are added to the series' quantum index, in the same round
//! and under the same quorum. This node remembers (boundedly) what it saw acknowledged, so
//! live data does not register or index the same thing again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use timeshard_proto::class::Replication;
use timeshard_proto::key::series_meta_id;
use timeshard_proto::placement::{WritePlan, WriteProgress, split_batch};
use timeshard_proto::quantum_index;
use timeshard_proto::wire::{BlockPoints, ErrorReply, RejectedPoint, Request, Response, SeriesPoints};
use timeshard_proto::{Contact, Id, SeriesKey};
use tokio::sync::mpsc;

use super::{Coordinator, PLACEMENT_PARALLELISM, unavailable};
use crate::policies;

/// Series remembered as registered before the memory is cleared.
const REGISTERED_CACHE_MAX: usize = 100_000;
/// (series, index span) pairs remembered as indexed before the memory is cleared.
const INDEXED_CACHE_MAX: usize = 1_000_000;

/// Where one part of a write goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Target {
    /// Blocks stored on a node.
    Blocks(Id),
    /// Series registrations stored on a node.
    Registrations(Id),
}

/// What a coordinated write did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteOutcome {
    /// Points stored (after policies and deduplication within the batch).
    pub points: u64,
    /// (series, quantum) blocks they fell into.
    pub blocks: u64,
    /// Points an ingest policy refused, and the first of them with reasons.
    pub rejected: u64,
    pub rejections: Vec<RejectedPoint>,
}

impl Coordinator {
    /// Writes a validated batch: runs ingest policies, then returns once every block has W
    /// acknowledgements.
    pub async fn write(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<WriteOutcome, ErrorReply> {
        let (batch, rejected, rejections) = match &self.policies {
            Some(registry) => {
                let ingested = policies::ingest(registry.clone(), batch).await?;
                (ingested.batch, ingested.rejected, ingested.rejections)
            }
            None => (batch, 0, Vec::new()),
        };
        if batch.is_empty() {
            return Ok(WriteOutcome { rejected, rejections, ..WriteOutcome::default() });
        }
        let (points, blocks) = self.replicate(batch).await?;
        Ok(WriteOutcome { points, blocks, rejected, rejections })
    }

    /// Places and stores a batch; returns (points, blocks) once every block has W acks. Series
    /// seen for the first time are registered, and quanta that hold data for the first time
    /// are added to the series' quantum index, in the same round and under the same quorum.
    async fn replicate(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<(u64, u64), ErrorReply> {
        let new_series: Vec<SeriesKey> = {
            let known = self.registered.lock().expect("registered lock");
            let mut seen = HashSet::new();
            batch.iter().map(|s| &s.series).filter(|s| !known.contains(*s) && seen.insert(*s)).cloned().collect()
        };
        let classes = self.classes();
        let data = split_batch(batch, &classes);
        let points: u64 = data.iter().map(|b| b.block.points.len() as u64).sum();
        let n_data = data.len();
        let new_spans: Vec<(SeriesKey, i64)> = {
            let indexed = self.indexed.lock().expect("indexed lock");
            let mut seen = HashSet::new();
            data.iter()
                .map(|b| (b.block.series.clone(), quantum_index::span_of(&b.block.quantum)))
                .filter(|k| !indexed.contains(k) && seen.insert(k.clone()))
                .collect()
        };

        // Everything stored: the data blocks, then the index blocks, each with where it goes.
        let mut stored: Vec<(Id, Replication, BlockPoints)> =
            data.into_iter().map(|b| (b.id, b.replication, b.block)).collect();
        for (series, block) in quantum_index::blocks(&new_spans) {
            stored.push((series_meta_id(&series), classes.of(&series).replication, block));
        }
        let n_stored = stored.len();
        let registrations: Vec<(Id, Replication)> =
            new_series.iter().map(|s| (series_meta_id(s), classes.of(s).replication)).collect();

        // Where everything goes: one lookup per block and per new series, a few at a time.
        let lookups: Vec<(Id, usize)> = stored
            .iter()
            .map(|(id, r, _)| (*id, usize::from(r.rf)))
            .chain(registrations.iter().map(|(id, r)| (*id, usize::from(r.rf))))
            .collect();
        let placements: Vec<Vec<Contact>> = futures::stream::iter(lookups)
            .map(|(id, rf)| self.dht.replicas(id, rf))
            .buffered(PLACEMENT_PARALLELISM)
            .collect()
            .await;
        let contacts: HashMap<Id, Contact> = placements.iter().flatten().map(|c| (c.id, *c)).collect();

        let needs = stored.iter().map(|(_, r, _)| r.w).chain(registrations.iter().map(|(_, r)| r.w));
        let items = needs.zip(placements.iter()).enumerate().map(|(i, (need, replicas))| {
            let target = |c: &Contact| if i < n_stored { Target::Blocks(c.id) } else { Target::Registrations(c.id) };
            (usize::from(need), replicas.iter().map(target).collect::<Vec<_>>())
        });
        let mut plan = WritePlan::new(items);
        if plan.progress() == WriteProgress::Failed {
            let known = self.dht.peer_count() + 1;
            return Err(unavailable(format!(
                "this node knows {known} node(s), fewer than a write quorum needs; start more nodes or lower rf/w \
                 in the series class"
            )));
        }

        let (tx, mut rx) = mpsc::channel(plan.requests().count().max(1));
        for (target, idx) in plan.requests() {
            let (id, req) = match *target {
                Target::Blocks(id) => {
                    (id, Request::Store { blocks: idx.iter().map(|&i| stored[i].2.clone()).collect() })
                }
                Target::Registrations(id) => (
                    id,
                    Request::RegisterSeries { series: idx.iter().map(|&i| new_series[i - n_stored].clone()).collect() },
                ),
            };
            let contact = contacts[&id];
            let (me, tx, target) = (self.clone(), tx.clone(), *target);
            // Each replica request runs to completion even after the quorum answered, so slow
            // replicas still get the data.
            tokio::spawn(async move {
                let outcome = match me.replica_call(&contact, req).await {
                    Ok(Response::Stored { .. }) => Ok(()),
                    Ok(other) => Err(format!("unexpected answer {other:?}")),
                    Err(e) => Err(e.message),
                };
                let _ = tx.send((target, outcome)).await;
            });
        }
        drop(tx);

        let mut errors = Vec::new();
        while let Some((target, outcome)) = rx.recv().await {
            let progress = match outcome {
                Ok(()) => plan.on_ack(&target),
                Err(e) => {
                    errors.push(e);
                    plan.on_failure(&target)
                }
            };
            match progress {
                WriteProgress::Pending => {}
                WriteProgress::Acknowledged => {
                    let mut known = self.registered.lock().expect("registered lock");
                    if known.len() + new_series.len() > REGISTERED_CACHE_MAX {
                        known.clear();
                    }
                    known.extend(new_series);
                    let mut indexed = self.indexed.lock().expect("indexed lock");
                    if indexed.len() + new_spans.len() > INDEXED_CACHE_MAX {
                        indexed.clear();
                    }
                    indexed.extend(new_spans);
                    return Ok((points, n_data as u64));
                }
                WriteProgress::Failed => break,
            }
        }
        Err(unavailable(format!(
            "too few replicas acknowledged the write ({}); some points may be stored, and retrying is safe \
             because writes are idempotent",
            errors.first().map(String::as_str).unwrap_or("no answer")
        )))
    }
}
