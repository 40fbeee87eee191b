//! Replaying hints: every [`REPLAY_EVERY`], each target with hints that the membership view
//! says is up gets them back, segment by segment, in `Store` and `RegisterSeries` requests
//! within the batch and message limits, paced to `replay_bytes_per_sec`. A segment is deleted
//! once every request of it was stored; a failure leaves it for the next round (stores are
//! idempotent, so sending part of it again is harmless). Also syncs new hints to disk in
//! batches.

use std::sync::Arc;
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_proto::placement::{block_bytes, pack, split_block};
use timeshard_proto::wire::{self, BlockPoints, Limits, Request, Response};
use timeshard_proto::{Contact, Id, SeriesKey};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{HintPayload, Hints, Segment};
use crate::dht::Dht;
use crate::membership::View;

/// How often targets are checked for replay.
pub const REPLAY_EVERY: Duration = Duration::from_millis(500);
/// How often new hints are synced to disk.
pub const SYNC_EVERY: Duration = Duration::from_millis(100);

/// Paces sending to a byte rate: after each request, waits as long as its bytes take at that
/// rate.
#[derive(Debug)]
struct Pace {
    bytes_per_sec: u64,
}

impl Pace {
    async fn sent(&self, bytes: usize) {
        let secs = bytes as f64 / self.bytes_per_sec.max(1) as f64;
        tokio::time::sleep(Duration::from_secs_f64(secs.min(10.0))).await;
    }
}

/// The requests that deliver `payloads` within `limits`.
pub fn requests(payloads: Vec<HintPayload>, limits: &Limits) -> Vec<Request> {
    let (max_points, max_bytes) = (limits.max_batch_points as usize, limits.max_message_bytes as usize);
    let mut blocks: Vec<BlockPoints> = Vec::new();
    let mut series: Vec<SeriesKey> = Vec::new();
    for p in payloads {
        match p {
            HintPayload::Blocks(b) => blocks.extend(b.into_iter().flat_map(|b| split_block(b, max_points, max_bytes))),
            HintPayload::Registrations(s) => series.extend(s),
        }
    }
    series.sort();
    series.dedup();
    let mut out: Vec<Request> = series
        .chunks(limits.max_batch_series.max(1) as usize)
        .map(|c| Request::RegisterSeries { series: c.to_vec() })
        .collect();
    let sizes: Vec<(usize, usize)> = blocks.iter().map(|b| (b.points.len(), block_bytes(b))).collect();
    let mut blocks: Vec<Option<BlockPoints>> = blocks.into_iter().map(Some).collect();
    for idx in pack(&sizes, max_points, max_bytes) {
        out.push(Request::Store { blocks: idx.iter().filter_map(|&i| blocks[i].take()).collect() });
    }
    out
}

/// The replay driver of one node.
#[derive(Debug)]
pub struct Replayer {
    pub hints: Arc<Hints>,
    pub view: Arc<View>,
    pub dht: Arc<Dht>,
    pub limits: Limits,
    pub bytes_per_sec: u64,
}

impl Replayer {
    /// Replays until `stop` fires.
    pub async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(REPLAY_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let hints = self.hints.clone();
            match timeshard_clock::spawn_blocking(move || hints.expire(now_ns())).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => warn!(hints = n, "dropped hints older than hints.max_age"),
                Ok(Err(e)) => warn!(error = %e, "cannot expire old hints"),
                Err(e) => warn!(error = %e, "hint expiry task failed"),
            }
            for target in self.hints.targets() {
                if stop.is_cancelled() {
                    return;
                }
                let Some(contact) = self.up_contact(&target) else { continue };
                if let Err(e) = self.replay_target(contact).await {
                    debug!(peer = %target.short(), error = %e, "hint replay stopped; will retry");
                }
            }
        }
    }

    /// The target's contact, if the view says it is up (and it is not this node).
    fn up_contact(&self, target: &Id) -> Option<Contact> {
        if *target == self.view.me().id || !self.view.is_up(target) {
            return None;
        }
        self.view.contact(target)
    }

    async fn replay_target(&self, contact: Contact) -> Result<(), String> {
        let hints = self.hints.clone();
        let target = contact.id;
        let segments = timeshard_clock::spawn_blocking(move || hints.take(&target))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        for segment in segments {
            self.replay_segment(contact, segment).await?;
        }
        Ok(())
    }

    async fn replay_segment(&self, contact: Contact, segment: Segment) -> Result<(), String> {
        let hints = self.hints.clone();
        let (records, damaged) = timeshard_clock::spawn_blocking(move || hints.read(&segment))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let now = now_ns();
        let (fresh, old): (Vec<_>, Vec<_>) = records.into_iter().partition(|h| !self.hints.expired(h.created_ns, now));
        let delivered = fresh.len() as u64;
        let points: usize = fresh.iter().map(|h| h.payload.points()).sum();
        let pace = Pace { bytes_per_sec: self.bytes_per_sec };
        for req in requests(fresh.into_iter().map(|h| h.payload).collect(), &self.limits) {
            let bytes = usize::try_from(wire::frame_bytes(&req)).unwrap_or(usize::MAX);
            match self.dht.call(&contact, &req).await {
                Ok(Response::Stored { .. }) => {}
                Ok(other) => return Err(format!("unexpected answer to a hint: {other:?}")),
                Err(e) => return Err(e.to_string()),
            }
            pace.sent(bytes).await;
        }
        let hints = self.hints.clone();
        let dropped = old.len() as u64 + damaged;
        timeshard_clock::spawn_blocking(move || hints.finish(&segment, delivered, dropped))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        info!(peer = %contact.id.short(), hints = delivered, points, dropped, "replayed hints");
        Ok(())
    }
}

/// Syncs new hints to disk every [`SYNC_EVERY`] until `stop` fires, and once more then.
pub async fn sync_loop(hints: Arc<Hints>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SYNC_EVERY);
    loop {
        let stopping = tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        let h = hints.clone();
        match timeshard_clock::spawn_blocking(move || h.sync()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot sync hints"),
            Err(e) => warn!(error = %e, "hint sync task failed"),
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use timeshard_proto::{Point, QuantumLen};

    use super::*;

    #[test]
    fn replay_requests_stay_within_the_limits() {
        let series: SeriesKey = "pmu.a".parse().unwrap();
        let q = QuantumLen::DEFAULT.quantum_of(0);
        let block = |n: i64| BlockPoints {
            series: series.clone(),
            quantum: q,
            points: (0..n).map(|i| Point::new(i, 0.0)).collect(),
        };
        let limits = Limits { max_batch_points: 100, max_batch_series: 2, ..Limits::default() };
        let payloads = vec![
            HintPayload::Blocks(vec![block(70), block(70)]),
            HintPayload::Registrations(vec![series.clone(), "b".parse().unwrap(), "c".parse().unwrap()]),
            HintPayload::Blocks(vec![block(250)]),
            HintPayload::Registrations(vec![series.clone()]),
        ];
        let reqs = requests(payloads, &limits);
        let mut points = 0;
        let mut registered = 0;
        for r in &reqs {
            r.validate(&limits).unwrap();
            match r {
                Request::Store { blocks } => points += blocks.iter().map(|b| b.points.len()).sum::<usize>(),
                Request::RegisterSeries { series } => registered += series.len(),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(points, 390);
        assert_eq!(registered, 3, "registrations are deduplicated");
    }
}
