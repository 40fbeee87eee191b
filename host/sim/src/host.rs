//! Simulated hosts: each node (and the clients) runs on a tokio runtime of its own, on the
//! simulator's one thread, with its clock paused. The simulator moves every host through the
//! same window of virtual time in turn ([`Host::run_until`]); inside a window a host's runtime
//! runs its tasks and jumps its clock from timer to timer as fast as the CPU allows.
//!
//! A window is no longer than the network's shortest latency, so nothing one host sends in a
//! window reaches another before the next one: running hosts one after the other inside a
//! window is exact, not an approximation. A crash drops the runtime, and with it every task
//! of the host wherever it was waiting: a crash at any await point.

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use timeshard_clock::sim as seams;

use crate::net::HostClock;

/// One simulated machine: a paused current-thread runtime, its clock and random stream.
#[derive(Debug)]
pub struct Host {
    pub name: String,
    rt: tokio::runtime::Runtime,
    seams: Rc<seams::Host>,
    clock: HostClock,
}

impl Host {
    /// A host booted at simulation time `now_ns`, whose wall clock reads `epoch_ns + now_ns`
    /// (plus its skew), with the random stream `seed`.
    pub fn boot(name: String, now_ns: u64, epoch_ns: i64, seed: u64) -> Host {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime builds");
        let origin = rt.block_on(async { tokio::time::Instant::now() });
        let wall = epoch_ns.saturating_add(i64::try_from(now_ns).unwrap_or(i64::MAX));
        let seams = Rc::new(seams::Host::new(origin, wall, seed));
        Host { name, rt, seams, clock: HostClock { origin, origin_ns: now_ns } }
    }

    /// The host's clock as its sockets read it.
    pub fn clock(&self) -> HostClock {
        self.clock
    }

    /// The seams the host's code reads (its wall clock's skew).
    pub fn seams(&self) -> &Rc<seams::Host> {
        &self.seams
    }

    /// Runs `f` as this host (its clock and generator; a tokio context of its runtime).
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        let _seams = seams::enter(&self.seams);
        let _rt = self.rt.enter();
        f()
    }

    /// Starts `task` on the host; it runs when the host does.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.enter(|| self.rt.spawn(task))
    }

    /// Runs the host's tasks until its clock reads simulation time `ns`.
    pub fn run_until(&self, ns: u64) {
        let deadline = self.clock.instant_at(ns);
        let _seams = seams::enter(&self.seams);
        // `--log` names the host and the window's end (simulation ms) on each line.
        let _span = tracing::info_span!("host", name = %self.name, t_ms = ns / 1_000_000).entered();
        self.rt.block_on(async move { tokio::time::sleep_until(deadline).await });
    }

    /// The host's simulation time.
    pub fn now_ns(&self) -> u64 {
        self.enter(|| self.clock.now_ns())
    }

    /// A crash: every task stops where it waits, nothing runs again.
    pub fn crash(self) {
        let _seams = seams::enter(&self.seams);
        self.rt.shutdown_timeout(Duration::ZERO);
    }
}
