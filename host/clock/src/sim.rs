//! The hooks a simulator sets per thread: which simulated host runs now, its wall clock and its
//! random stream. Production code never calls [`enter`]; there every hook reads "not
//! simulated" from one thread-local and the plain source is used.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use rand::{RngCore, SeedableRng};

/// A generator handed out by [`crate::rng`].
#[derive(Debug)]
pub enum Rng {
    /// Outside a simulation: the thread's generator.
    Thread(rand::rngs::ThreadRng),
    /// Under simulation: seeded from the host's stream.
    Seeded(Box<rand::rngs::StdRng>),
}

impl RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        match self {
            Rng::Thread(r) => r.next_u32(),
            Rng::Seeded(r) => r.next_u32(),
        }
    }
    fn next_u64(&mut self) -> u64 {
        match self {
            Rng::Thread(r) => r.next_u64(),
            Rng::Seeded(r) => r.next_u64(),
        }
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        match self {
            Rng::Thread(r) => r.fill_bytes(dst),
            Rng::Seeded(r) => r.fill_bytes(dst),
        }
    }
}

/// One simulated host as the seams see it: its wall clock (the virtual time of its runtime,
/// plus a skew the simulator may change at any moment: a skewed or jumping clock) and its
/// random stream.
#[derive(Debug)]
pub struct Host {
    /// The host runtime's (virtual) clock when the wall clock read `wall_at_origin`.
    origin: tokio::time::Instant,
    wall_at_origin: i64,
    skew_ns: Cell<i64>,
    seeds: Cell<u64>,
}

impl Host {
    /// A host whose wall clock reads `wall_at_origin` when its runtime's clock reads `origin`,
    /// with the random stream `seed`. Create it inside the host's runtime (its clock is the
    /// one `origin` belongs to).
    pub fn new(origin: tokio::time::Instant, wall_at_origin: i64, seed: u64) -> Host {
        Host { origin, wall_at_origin, skew_ns: Cell::new(0), seeds: Cell::new(seed) }
    }

    /// How far this host's wall clock is off the true (simulated) time, in nanoseconds.
    pub fn skew_ns(&self) -> i64 {
        self.skew_ns.get()
    }

    /// Sets the skew: a clock that is off, or (a sudden change) one that jumps.
    pub fn set_skew_ns(&self, skew: i64) {
        self.skew_ns.set(skew);
    }

    /// The host's wall clock, now.
    pub fn wall_ns(&self) -> i64 {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        let elapsed = i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX);
        self.wall_at_origin.saturating_add(elapsed).saturating_add(self.skew_ns.get())
    }

    /// The next value of the host's random stream (SplitMix64).
    pub fn next_seed(&self) -> u64 {
        let s = self.seeds.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.seeds.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Host>>> = const { RefCell::new(None) };
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// While the returned guard lives, this thread runs `host`: the seams answer from it.
pub fn enter(host: &Rc<Host>) -> Entered {
    let previous = CURRENT.with(|c| c.replace(Some(host.clone())));
    let was_active = ACTIVE.with(|a| a.replace(true));
    Entered { previous, was_active }
}

/// The guard of [`enter`]; dropping it restores what ran before.
#[derive(Debug)]
pub struct Entered {
    previous: Option<Rc<Host>>,
    was_active: bool,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
        ACTIVE.with(|a| a.set(self.was_active));
    }
}

/// Whether this thread runs a simulated host.
pub fn active() -> bool {
    ACTIVE.with(Cell::get)
}

/// The simulated host's wall clock, if this thread runs one.
pub fn wall_ns() -> Option<i64> {
    if !active() {
        return None;
    }
    CURRENT.with(|c| c.borrow().as_ref().map(|h| h.wall_ns()))
}

/// A generator from the simulated host's stream, if this thread runs one.
pub fn rng() -> Option<Rng> {
    if !active() {
        return None;
    }
    CURRENT
        .with(|c| c.borrow().as_ref().map(|h| Rng::Seeded(Box::new(rand::rngs::StdRng::seed_from_u64(h.next_seed())))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng as _;

    #[test]
    fn a_host_owns_the_clock_and_the_generator_while_entered() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let host = Rc::new(Host::new(tokio::time::Instant::now(), 1_000, 7));
            assert!(!active());
            let draws = |host: &Rc<Host>| {
                let _in = enter(host);
                (0..4).map(|_| crate::rng().random::<u64>()).collect::<Vec<_>>()
            };
            let first = draws(&host);
            {
                let _in = enter(&host);
                assert_eq!(crate::now_ns(), 1_000);
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                assert_eq!(crate::now_ns(), 1_000_001_000);
                host.set_skew_ns(-2_000_000_000);
                assert_eq!(crate::now_ns(), -999_999_000);
            }
            assert!(crate::now_ns() > 1_704_067_200_000_000_000, "outside, the real clock");
            // The same seed, the same draws; the stream moves on.
            let again = Rc::new(Host::new(tokio::time::Instant::now(), 0, 7));
            assert_eq!(draws(&again), first);
            assert_ne!(draws(&again), first);
        });
    }

    #[test]
    fn blocking_work_runs_on_the_runtime_under_simulation() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let host = Rc::new(Host::new(tokio::time::Instant::now(), 0, 1));
            let _in = enter(&host);
            let here = std::thread::current().id();
            let ran_on = crate::spawn_blocking(move || std::thread::current().id()).await.unwrap();
            assert_eq!(ran_on, here);
        });
    }
}
