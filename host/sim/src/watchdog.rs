//! A run whose simulated time stands still: some task runs without ever waiting on simulated
//! time (a loop that reaches no peer and sleeps for nothing), so one window of simulated
//! milliseconds never ends and the run would hang in wall time. A thread beside the run
//! notices that no window ended for [`STALL_LIMIT`] and ends the process, naming the seed and
//! the simulated time it stood at (issue 24, seed 20075), rather than let a run of a thousand
//! seeds hang on one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Wall time one window (milliseconds of simulated time) may take: about a millisecond is
/// usual, a loaded machine a hundred times more.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// The process's exit code when a run stood still.
pub const EXIT_STALLED: i32 = 3;

/// What to do, once, before the process ends for a run that stood still: called with the seed
/// and the simulated milliseconds it stood at (`scripts/simulate` writes its JSON report).
type OnStall = Box<dyn Fn(u64, u64) + Send + Sync>;
static ON_STALL: OnceLock<OnStall> = OnceLock::new();

/// Sets what runs before the process ends for a stalled run (the first call wins).
pub fn on_stall(f: impl Fn(u64, u64) + Send + Sync + 'static) {
    let _ = ON_STALL.set(Box::new(f));
}

/// Watches one run; stops watching when dropped.
#[derive(Debug)]
pub struct Watchdog {
    simulated_ns: Arc<AtomicU64>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching the run of `seed`.
    pub fn start(seed: u64) -> Watchdog {
        let simulated_ns = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = mpsc::channel::<()>();
        let seen = simulated_ns.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sim-watchdog-{seed}"))
            .spawn(move || {
                let (mut last, mut since) = (seen.load(Ordering::Relaxed), Instant::now());
                loop {
                    match stopped.recv_timeout(Duration::from_secs(1)) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let now = seen.load(Ordering::Relaxed);
                    if now != last {
                        (last, since) = (now, Instant::now());
                    } else if since.elapsed() >= STALL_LIMIT {
                        eprintln!(
                            "seed {seed}: FAIL liveness: simulated time stood still at {} ms for {STALL_LIMIT:?} of wall \
                             time: a task runs without ever waiting on simulated time; replay with \
                             `scripts/simulate --seed {seed} --log` (and the run's other options)",
                            now / 1_000_000
                        );
                        if let Some(f) = ON_STALL.get() {
                            f(seed, now / 1_000_000);
                        }
                        std::process::exit(EXIT_STALLED);
                    }
                }
            })
            .expect("a thread for the watchdog");
        Watchdog { simulated_ns, stop: Some(stop), thread: Some(thread) }
    }

    /// The run reached simulated time `ns`.
    pub fn beat(&self, ns: u64) {
        self.simulated_ns.store(ns, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
