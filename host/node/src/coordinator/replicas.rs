//! Writes to replicas as tasks that may outlive the client's write: tracked (the node waits
//! for them at shutdown, within its grace period), bounded, and handed to hints when they
//! cannot complete.
//!
//! Every replica request of a write runs as a task here. Once the write has its quorum (or
//! has failed), the requests still running are detached: each takes one of
//! `max_replica_writes` permits and runs on, or, when none is free, is stopped and becomes a
//! hint. A replica request that fails with a fault of the replica (down, overloaded, timed
//! out, its store failed) becomes a hint too, so the replica gets the data once it is back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_proto::Id;
use timeshard_proto::wire::{ErrorReply, Request};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::hints::{HintPayload, Hints};

/// A replica request still running.
#[derive(Debug)]
struct Running {
    target: Id,
    req: Arc<Request>,
    abort: Option<AbortHandle>,
    /// Held while the request runs on after its write was answered.
    _permit: Option<OwnedSemaphorePermit>,
}

/// The replica requests of this node's writes.
#[derive(Debug)]
pub struct ReplicaWrites {
    me: Id,
    hints: Arc<Hints>,
    slots: Arc<Semaphore>,
    max_detached: usize,
    tasks: TaskTracker,
    running: std::sync::Mutex<HashMap<u64, Running>>,
    next: AtomicU64,
}

/// What a hint keeps of a replica request.
fn payload(req: &Request) -> Option<HintPayload> {
    match req {
        Request::Store { blocks } => Some(HintPayload::Blocks(blocks.clone())),
        Request::RegisterSeries { series } => Some(HintPayload::Registrations(series.clone())),
        _ => None,
    }
}

impl ReplicaWrites {
    /// Replica writes of node `me`, at most `max_detached` running on after their write was
    /// answered, handing what fails to `hints`.
    pub fn new(me: Id, hints: Arc<Hints>, max_detached: usize) -> ReplicaWrites {
        ReplicaWrites {
            me,
            hints,
            slots: Arc::new(Semaphore::new(max_detached)),
            max_detached,
            tasks: TaskTracker::new(),
            running: std::sync::Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    /// The hint store.
    pub fn hints(&self) -> &Arc<Hints> {
        &self.hints
    }

    /// Requests running on after their write was answered.
    pub fn detached(&self) -> usize {
        self.max_detached - self.slots.available_permits()
    }

    /// Keeps `req` as a hint for `target` (off the async threads).
    pub fn hint(self: &Arc<Self>, target: Id, req: &Request) {
        if target == self.me {
            return;
        }
        let Some(payload) = payload(req) else { return };
        let hints = self.hints.clone();
        let keep = move || match hints.add(target, payload, now_ns()) {
            Ok(true) => {}
            Ok(false) => debug!(peer = %target.short(), "hint dropped: hints.max_bytes reached"),
            Err(e) => warn!(peer = %target.short(), error = %e, "cannot keep a hint"),
        };
        // Under simulation blocking work runs on the simulator's thread (timeshard_clock).
        if timeshard_clock::sim::active() {
            self.tasks.spawn(async move { keep() });
        } else {
            self.tasks.spawn_blocking(keep);
        }
    }

    /// Runs `call` (which sends `req` to `target`) as a tracked task and returns its handle;
    /// `done` gets the outcome. A failure the replica may not repeat later becomes a hint.
    pub fn spawn<F, D>(self: &Arc<Self>, target: Id, req: Arc<Request>, call: F, done: D) -> u64
    where
        F: Future<Output = Result<(), ErrorReply>> + Send + 'static,
        D: FnOnce(Result<(), ErrorReply>) + Send + 'static,
    {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut running = self.running.lock().expect("replica writes lock");
        running.insert(key, Running { target, req: req.clone(), abort: None, _permit: None });
        let me = self.clone();
        let handle = self.tasks.spawn(async move {
            let outcome = call.await;
            let finished = me.running.lock().expect("replica writes lock").remove(&key);
            if let (Err(e), Some(r)) = (&outcome, finished)
                && e.code.is_replica_fault()
            {
                me.hint(r.target, &r.req);
            }
            done(outcome);
        });
        if let Some(r) = running.get_mut(&key) {
            r.abort = Some(handle.abort_handle());
        }
        key
    }

    /// Lets the requests `keys` that still run go on after their write was answered, each
    /// holding a permit; those that find none are stopped and become hints.
    pub fn detach(self: &Arc<Self>, keys: impl IntoIterator<Item = u64>) {
        let mut running = self.running.lock().expect("replica writes lock");
        for key in keys {
            let Some(r) = running.get_mut(&key) else { continue };
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => r._permit = Some(permit),
                Err(_) => {
                    let r = running.remove(&key).expect("present");
                    if let Some(abort) = r.abort {
                        abort.abort();
                    }
                    self.hint(r.target, &r.req);
                }
            }
        }
    }

    /// At shutdown: waits up to `grace` for the requests still running, then stops the rest
    /// and keeps them as hints, and syncs the hints.
    pub async fn shutdown(self: &Arc<Self>, grace: Duration) {
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait()).await.is_err() {
            let rest: Vec<Running> =
                self.running.lock().expect("replica writes lock").drain().map(|(_, r)| r).collect();
            warn!(requests = rest.len(), "replica writes still running at shutdown; keeping them as hints");
            let hints = self.hints.clone();
            let me = self.me;
            let kept = timeshard_clock::spawn_blocking(move || {
                for r in rest {
                    if let Some(abort) = &r.abort {
                        abort.abort();
                    }
                    if let (true, Some(payload)) = (r.target != me, payload(&r.req)) {
                        let _ = hints.add(r.target, payload, now_ns());
                    }
                }
            });
            let _ = kept.await;
        }
        let hints = self.hints.clone();
        match timeshard_clock::spawn_blocking(move || hints.sync()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot sync hints at shutdown"),
            Err(e) => warn!(error = %e, "hint sync task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use timeshard_proto::wire::{BlockPoints, ErrorCode};
    use timeshard_proto::{Point, QuantumLen};
    use tokio::sync::oneshot;

    use super::*;
    use crate::config::HintsConfig;

    fn store_req() -> Arc<Request> {
        let block = BlockPoints {
            series: "pmu.a".parse().unwrap(),
            quantum: QuantumLen::DEFAULT.quantum_of(0),
            points: vec![Point::new(1, 1.0)],
        };
        Arc::new(Request::Store { blocks: vec![block] })
    }

    #[tokio::test]
    async fn failures_and_requests_without_a_permit_become_hints() {
        let dir = tempfile::tempdir().unwrap();
        let hints = Arc::new(Hints::open(dir.path(), HintsConfig::default()).unwrap());
        let writes = Arc::new(ReplicaWrites::new(Id::sha1(b"me"), hints.clone(), 1));
        let (peer_a, peer_b, peer_c) = (Id::sha1(b"a"), Id::sha1(b"b"), Id::sha1(b"c"));

        // A replica fault becomes a hint; a request the replica refuses as wrong does not.
        let (tx, rx) = oneshot::channel();
        writes.spawn(peer_a, store_req(), async { Err(ErrorReply::new(ErrorCode::Overloaded, "busy")) }, |o| {
            let _ = tx.send(o);
        });
        assert!(rx.await.unwrap().is_err());
        writes.spawn(peer_a, store_req(), async { Err(ErrorReply::new(ErrorCode::Malformed, "bad")) }, |_| {});

        // Two slow requests detached with one permit: one runs on, one becomes a hint.
        let (release, wait) = tokio::sync::watch::channel(false);
        let slow = |mut wait: tokio::sync::watch::Receiver<bool>| async move {
            let _ = wait.wait_for(|v| *v).await;
            Ok(())
        };
        let b = writes.spawn(peer_b, store_req(), slow(wait.clone()), |_| {});
        let c = writes.spawn(peer_c, store_req(), slow(wait), |_| {});
        writes.detach([b, c]);
        assert_eq!(writes.detached(), 1);
        release.send(true).unwrap();
        writes.shutdown(Duration::from_secs(5)).await;
        assert_eq!(writes.detached(), 0);
        let mut targets = hints.targets();
        targets.sort();
        let mut want = vec![peer_a, peer_c];
        want.sort();
        assert_eq!(targets, want);
        assert_eq!(hints.pending().0, 2);
    }

    #[tokio::test]
    async fn shutdown_keeps_what_is_still_running_as_hints() {
        let dir = tempfile::tempdir().unwrap();
        let hints = Arc::new(Hints::open(dir.path(), HintsConfig::default()).unwrap());
        let writes = Arc::new(ReplicaWrites::new(Id::sha1(b"me"), hints.clone(), 4));
        let stuck = writes.spawn(Id::sha1(b"a"), store_req(), std::future::pending(), |_| {});
        writes.detach([stuck]);
        writes.shutdown(Duration::from_millis(50)).await;
        assert_eq!(hints.pending().0, 1);
        drop(writes);
        drop(hints);
        let reopened = Hints::open(dir.path(), HintsConfig::default()).unwrap();
        assert_eq!(reopened.pending().0, 1, "the hint is on disk");
    }
}
