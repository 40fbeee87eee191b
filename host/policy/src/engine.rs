//! Engine policy, in one place: the wasmtime configuration (pooling allocator, epoch
//! interruption, no fuel), the epoch ticker thread, the per-call store with its memory limiter
//! and deadline, the linker that grants only the `host` interface, and the cache of compiled
//! components by content hash.
//!
//! Implementation notes:
//! - Every call gets a fresh instance from an `InstancePre`, in a fresh `Store`; with the
//!   pooling allocator and copy-on-write memory images that costs a few microseconds, and a
//!   trapped, timed-out or over-limit instance is simply dropped (its slot is recycled), so no
//!   state leaks from one call, or one series, to the next.
//! - Deadlines are epochs: a thread advances the engine's epoch with the clock, one per
//!   `epoch_tick` (catching up after oversleeping), and each store's deadline is
//!   `ceil(deadline / tick) + 1` ticks away, plus the ticks the ticker still owes the clock
//!   (it may be catching up), so a call is never stopped before its deadline and is stopped
//!   at most one tick (plus scheduling) after it.
//! - The memory cap is enforced twice: by the pool's slot size (`Limits::memory_bytes`) and,
//!   per policy, by the store's `ResourceLimiter` over all the memories of the call together,
//!   which also records that it refused so a resulting trap is reported as `MemoryLimit`. A
//!   component may hold one memory and a few core instances and tables of the pool (refused
//!   when compiled otherwise), so a call cannot take the slots of other calls.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap,
};

use crate::bindings::{self, IngestPolicyPre, QueryPolicyPre};
use crate::host_log::GuestLog;
use crate::pool::{Backend, default_reservation, slot_layout};
use crate::{Kind, PolicyError};

pub use crate::component::ALLOWED_IMPORTS;
use crate::component::ALLOWED_IMPORTS_TEXT;

/// Bounds on everything that crosses the guest boundary, for the whole node. A policy's
/// [`crate::Settings`] may lower the deadline and memory cap, or raise the deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time a call may run (instantiation included). Default 10 ms.
    pub deadline: Duration,
    /// How often the epoch advances: the granularity of deadlines. Default 1 ms.
    pub epoch_tick: Duration,
    /// Linear memory one instance may use. Default 64 MiB (16 MiB on 32-bit hosts).
    pub memory_bytes: u64,
    /// Instances that may run at once (pool slots); further calls wait for a free one. Default 64
    /// (8 on 32-bit hosts).
    pub max_instances: u32,
    /// Address space the pool reserves for all its linear memories, split evenly over the
    /// slots (see [`crate::pool`]). Default [`crate::pool::default_reservation`]: 4 GiB and a
    /// guard per slot on 64-bit hosts with native code (virtual only), one memory cap per slot
    /// elsewhere (128 MiB on 32-bit hosts).
    pub reservation_bytes: u64,
    /// Native code or the Pulley interpreter. Default [`Backend::Auto`].
    pub backend: Backend,
    /// Bytes of each pool slot's memory kept resident between calls and reset in place
    /// (only the dirtied pages, where the kernel supports PAGEMAP_SCAN). Default 4 MiB (1 MiB
    /// on 32-bit hosts).
    pub memory_keep_resident: u64,
    /// Points in one ingest batch. Default 100,000.
    pub max_batch_points: usize,
    /// Points in one `summarize` call; a larger quantum is split into several calls. Default
    /// 262,144.
    pub max_summarize_points: usize,
    /// Partials in one merge. Default 1,000,000.
    pub max_partials: usize,
    /// Points carried by all partials of one merge. Default 1,000,000.
    pub max_merge_points: usize,
    /// Settings or parameters passed to one call. Default 64.
    pub max_settings: usize,
    /// Bytes of any string crossing the boundary (setting, reason, error, log line, value
    /// name); longer ones are refused on the way in and truncated on the way out. Default 1 KiB.
    pub max_string_bytes: usize,
    /// Log lines a call may write. Default 16.
    pub max_log_lines: u32,
    /// Compiled components kept in the cache. Default 64.
    pub max_cached_components: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // A 32-bit node has at most 3 GiB of address space for everything.
        let (memory_bytes, max_instances, memory_keep_resident) =
            if cfg!(target_pointer_width = "32") { (16 << 20, 8, 1 << 20) } else { (64 << 20, 64, 4 << 20) };
        Limits {
            deadline: Duration::from_millis(10),
            epoch_tick: Duration::from_millis(1),
            memory_bytes,
            max_instances,
            reservation_bytes: default_reservation(memory_bytes, max_instances, Backend::Auto),
            backend: Backend::Auto,
            memory_keep_resident,
            max_batch_points: 100_000,
            max_summarize_points: 262_144,
            max_partials: 1_000_000,
            max_merge_points: 1_000_000,
            max_settings: 64,
            max_string_bytes: 1024,
            max_log_lines: 16,
            max_cached_components: 64,
        }
    }
}

/// Advances the engine's epoch until dropped.
#[derive(Debug)]
struct Ticker {
    stop: Arc<AtomicBool>,
    clock: Arc<TickClock>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: Engine, tick: Duration) -> Result<Ticker, PolicyError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let clock = Arc::new(TickClock {
            start: std::time::Instant::now(),
            tick_ns: tick.as_nanos().max(1),
            issued: std::sync::atomic::AtomicU64::new(0),
        });
        let ticks_clock = clock.clone();
        let thread = std::thread::Builder::new()
            .name("policy-epoch".into())
            .spawn(move || {
                // The epoch follows the clock, not the number of wake-ups: a sleep that
                // overslept (a busy machine) is made up at once, so deadlines stay in wall time.
                let clock = ticks_clock;
                let mut ticks = 0u64;
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    let due = clock.due();
                    while ticks < due {
                        engine.increment_epoch();
                        ticks += 1;
                    }
                    clock.issued.store(ticks, Ordering::Release);
                }
            })
            .map_err(|e| PolicyError::Engine(format!("cannot start the epoch thread: {e}")))?;
        Ok(Ticker { stop, clock, thread: Some(thread) })
    }

    /// Ticks the epoch owes the wall clock right now: a deadline set now must add them, or the
    /// catch-up burst of an oversleeping ticker would stop the call before its deadline.
    fn lag(&self) -> u64 {
        self.clock.due().saturating_sub(self.clock.issued.load(Ordering::Acquire))
    }
}

/// The wall clock the epoch follows: tick `n` is due `n` ticks after `start`.
#[derive(Debug)]
struct TickClock {
    start: std::time::Instant,
    tick_ns: u128,
    /// Ticks the ticker thread has issued so far.
    issued: std::sync::atomic::AtomicU64,
}

impl TickClock {
    fn due(&self) -> u64 {
        (self.start.elapsed().as_nanos() / self.tick_ns) as u64
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Refuses memory and table growth past the call's caps, and remembers that it did.
#[derive(Debug)]
pub(crate) struct CallLimiter {
    /// The cap on all the linear memories of the call's store together.
    memory_bytes: usize,
    /// Bytes of linear memory the store holds: the sum over its memories.
    memory_used: usize,
    pub(crate) refused: bool,
}

impl CallLimiter {
    pub(crate) fn new(memory_bytes: usize) -> CallLimiter {
        CallLimiter { memory_bytes, memory_used: 0, refused: false }
    }
}

thread_local! {
    /// The most linear memory a call on this thread used since [`take_peak_memory`] was last
    /// called: calls are synchronous, so the caller reads what its own calls used.
    static PEAK_MEMORY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The most linear memory (all memories of a call together) that one call made on this thread
/// used since the last time this was called; resets it.
pub(crate) fn take_peak_memory() -> u64 {
    PEAK_MEMORY.with(|p| p.replace(0))
}

/// Table elements an instance may have; policies need a handful.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// What one component may hold of the pool. A wit-bindgen policy has one memory, two tables and
/// three core instances; the pool has this much for each of `max_instances` calls, so one
/// component can neither take the slots of other calls nor spread its data over several
/// memories. A component that needs more is refused when it is compiled.
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 4;
const MAX_MEMORIES_PER_COMPONENT: u32 = 1;
const MAX_TABLES_PER_COMPONENT: u32 = 2;

impl ResourceLimiter for CallLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Called for a new memory too (`current` 0): the cap is on all memories together.
        let used = self.memory_used.saturating_sub(current).saturating_add(desired);
        if used > self.memory_bytes {
            self.refused = true;
            return Ok(false);
        }
        self.memory_used = used;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }
}

/// The bytes the host copies out of a guest whose memory is capped at `memory_bytes`, in one
/// crossing (a result, or one host call's arguments): the cap. A result that respects the
/// documented bounds is far smaller (100,000 points are 2.4 MB).
fn copy_limit(memory_bytes: u64) -> usize {
    usize::try_from(memory_bytes).unwrap_or(usize::MAX)
}

/// The data of one call's store.
#[derive(Debug)]
pub(crate) struct CallState {
    pub(crate) policy: Arc<str>,
    pub(crate) limiter: CallLimiter,
    pub(crate) log: GuestLog,
}

impl bindings::host::Host for CallState {
    fn log(&mut self, level: bindings::host::Level, message: String) {
        self.log.write(&self.policy, level, message);
    }
}

/// A compiled, type-checked policy, ready to instantiate.
#[derive(Clone)]
pub(crate) enum Pre {
    Ingest(IngestPolicyPre<CallState>),
    Query(QueryPolicyPre<CallState>),
}

/// The per-policy bounds of a call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallLimits {
    pub(crate) deadline: Duration,
    pub(crate) memory_bytes: u64,
}

/// The wasmtime engine and everything shared by all policies of a node.
pub(crate) struct Runtime {
    engine: Engine,
    linker: Linker<CallState>,
    cache: Mutex<Cache>,
    slots: Slots,
    pub(crate) limits: Limits,
    ticker: Ticker,
}

/// The pool's instance slots, as a counting semaphore: with `max_instances` calls running, the
/// next one waits for a slot (at most until a running call's deadline) instead of failing to
/// instantiate, which refused the batch, or passed it through unprocessed.
#[derive(Debug)]
struct Slots {
    count: Mutex<SlotCount>,
    freed: Condvar,
}

#[derive(Debug)]
struct SlotCount {
    free: u32,
    waiting: u32,
}

/// A slot taken for one call; given back when dropped.
struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(n: u32) -> Slots {
        Slots { count: Mutex::new(SlotCount { free: n, waiting: 0 }), freed: Condvar::new() }
    }

    fn take(&self) -> Slot<'_> {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        while count.free == 0 {
            count.waiting += 1;
            count = self.freed.wait(count).unwrap_or_else(PoisonError::into_inner);
            count.waiting -= 1;
        }
        count.free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().unwrap_or_else(PoisonError::into_inner);
        count.free += 1;
        // Waking costs a system call; most calls find nobody waiting.
        if count.waiting > 0 {
            self.0.freed.notify_one();
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("limits", &self.limits).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Cache {
    components: HashMap<[u8; 32], Component>,
    order: VecDeque<[u8; 32]>,
}

impl Runtime {
    pub(crate) fn new(limits: Limits) -> Result<Runtime, PolicyError> {
        if limits.epoch_tick.is_zero() || limits.deadline.is_zero() {
            return Err(PolicyError::Config("deadline and epoch_tick must be longer than zero".into()));
        }
        let layout = slot_layout(limits.memory_bytes, limits.max_instances, limits.reservation_bytes, limits.backend)?;
        let mut pool = PoolingAllocationConfig::new();
        let n = limits.max_instances.max(1);
        pool.total_component_instances(n)
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
            .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
            .total_core_instances(n * MAX_CORE_INSTANCES_PER_COMPONENT)
            .total_memories(n * MAX_MEMORIES_PER_COMPONENT)
            .total_tables(n * MAX_TABLES_PER_COMPONENT)
            .max_memory_size(limits.memory_bytes as usize)
            // Reset a recycled slot by rewriting only the pages the last call dirtied (found
            // with PAGEMAP_SCAN on Linux 6.7+), instead of discarding them all and taking a
            // page fault on each again: most of the cost of a call otherwise.
            .pagemap_scan(Enabled::Auto)
            .linear_memory_keep_resident(limits.memory_keep_resident as usize)
            .table_keep_resident(64 << 10);

        let mut config = Config::new();
        if let Some(target) = limits.backend.target()? {
            config.target(target).map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        }
        config
            .memory_reservation(layout.reservation)
            .memory_guard_size(layout.guard)
            // Pool slots never move, so room to grow into is wasted address space.
            .memory_reservation_for_growth(0)
            .wasm_component_model(true)
            .epoch_interruption(true)
            .consume_fuel(false)
            .cranelift_opt_level(OptLevel::Speed)
            // Traps are reported by kind, not by backtrace; capturing one costs time.
            .wasm_backtrace_max_frames(None)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| {
            PolicyError::Engine(format!(
                "cannot reserve {} MiB of address space for the policy pool ({n} instances of {} MiB{}): {e:#}; lower \
                 policy.reservation_mib, policy.max_instances or policy.memory_mib",
                layout.total(n) >> 20,
                layout.reservation >> 20,
                if layout.guard > 0 { format!(" and a {} MiB guard", layout.guard >> 20) } else { String::new() },
            ))
        })?;
        tracing::debug!(
            instances = n,
            slot_mib = layout.reservation >> 20,
            guard_mib = layout.guard >> 20,
            pulley = engine.is_pulley(),
            "policy engine ready"
        );

        let mut linker = Linker::new(&engine);
        bindings::host::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        let ticker = Ticker::start(engine.clone(), limits.epoch_tick)?;
        Ok(Runtime { engine, linker, cache: Mutex::new(Cache::default()), slots: Slots::new(n), limits, ticker })
    }

    /// Compiles (or takes from the cache) and type-checks a component whose signature has
    /// already been verified.
    pub(crate) fn load(&self, policy: &str, kind: Kind, bytes: &[u8]) -> Result<Pre, PolicyError> {
        let component = self.compile(policy, bytes)?;
        let ty = component.component_type();
        for (name, _) in ty.imports(&self.engine) {
            if !ALLOWED_IMPORTS.contains(&name) {
                return Err(PolicyError::ForbiddenImport {
                    policy: policy.to_string(),
                    import: name.to_string(),
                    allowed: ALLOWED_IMPORTS_TEXT,
                });
            }
        }
        let wrong = |e: wasmtime::Error| PolicyError::WrongWorld {
            policy: policy.to_string(),
            expected: kind,
            reason: format!("{e:#}"),
        };
        let pre = self.linker.instantiate_pre(&component).map_err(wrong)?;
        Ok(match kind {
            Kind::Ingest => Pre::Ingest(IngestPolicyPre::new(pre).map_err(wrong)?),
            Kind::Query => Pre::Query(QueryPolicyPre::new(pre).map_err(wrong)?),
        })
    }

    fn compile(&self, policy: &str, bytes: &[u8]) -> Result<Component, PolicyError> {
        let hash = crate::signing::sha256(bytes);
        if let Some(c) = self.cache.lock().unwrap().components.get(&hash) {
            return Ok(c.clone());
        }
        // Compile outside the lock: it takes milliseconds to seconds.
        let component = Component::new(&self.engine, bytes).map_err(|e| {
            let mut reason = format!("{e:#}");
            if bytes.starts_with(b"\0asm\x01\0\0\0") {
                reason.push_str("; this is a core module, not a component");
            }
            PolicyError::Malformed { policy: policy.to_string(), reason }
        })?;
        let mut cache = self.cache.lock().unwrap();
        if !cache.components.contains_key(&hash) {
            while cache.order.len() >= self.limits.max_cached_components.max(1) {
                if let Some(old) = cache.order.pop_front() {
                    cache.components.remove(&old);
                }
            }
            cache.order.push_back(hash);
            cache.components.insert(hash, component.clone());
        }
        Ok(component)
    }

    /// Whether policies run on the Pulley interpreter rather than as native code.
    pub(crate) fn is_pulley(&self) -> bool {
        self.engine.is_pulley()
    }

    /// Compiled components in the cache.
    pub(crate) fn cached_components(&self) -> usize {
        self.cache.lock().unwrap().components.len()
    }

    /// Runs `f` in a fresh store under the call's deadline and memory cap, and turns a failure
    /// into the matching typed error. Waits for a free pool slot first; the deadline starts
    /// once it has one. The store (and its instance) is dropped on return, which recycles the
    /// pool slot whatever happened.
    pub(crate) fn run<T>(
        &self,
        policy: &Arc<str>,
        limits: CallLimits,
        f: impl FnOnce(&mut Store<CallState>) -> wasmtime::Result<T>,
    ) -> Result<T, PolicyError> {
        // Taken before the store, so given back after the store (and its instance) is dropped.
        let _slot = self.slots.take();
        let state = CallState {
            policy: policy.clone(),
            limiter: CallLimiter::new(limits.memory_bytes.min(self.limits.memory_bytes) as usize),
            log: GuestLog::new(self.limits.max_log_lines, self.limits.max_string_bytes),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // What the host copies out of the guest in one crossing (a result, a log line) is
        // bounded by what the guest can hold: without this, wasmtime allows 128 MiB whatever
        // the memory cap, and a result whose strings all point at the same bytes of guest
        // memory is copied once per string.
        store.set_hostcall_fuel(copy_limit(limits.memory_bytes.min(self.limits.memory_bytes)));
        let tick = self.limits.epoch_tick.as_nanos().max(1);
        let ticks = limits.deadline.as_nanos().div_ceil(tick) as u64 + 1 + self.ticker.lag();
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();
        let result = f(&mut store);
        let used = store.data().limiter.memory_used as u64;
        PEAK_MEMORY.with(|p| p.set(p.get().max(used)));
        match result {
            Ok(v) => Ok(v),
            Err(e) => Err(self.classify(e, &limits, store.data_mut())),
        }
    }

    fn classify(&self, e: wasmtime::Error, limits: &CallLimits, state: &mut CallState) -> PolicyError {
        let policy = state.policy.to_string();
        let trap = e.downcast_ref::<Trap>().copied();
        if trap.is_none() && format!("{e:#}").contains("fuel allocated for hostcalls has been exhausted") {
            let limit = copy_limit(state.limiter.memory_bytes as u64);
            return PolicyError::BadOutput {
                policy,
                reason: format!(
                    "it returned or logged more than {} MiB in one piece, which is more than the host copies out \
                     of a guest (its memory cap); strings pointing at the same bytes count once each",
                    limit >> 20
                ),
            };
        }
        if trap == Some(Trap::Interrupt) {
            return PolicyError::Timeout { policy, deadline_ms: limits.deadline.as_millis() as u64 };
        }
        if state.limiter.refused {
            return PolicyError::MemoryLimit { policy, limit_bytes: state.limiter.memory_bytes as u64 };
        }
        match trap {
            Some(t) => PolicyError::Trap { policy, message: t.to_string(), last_log: state.log.take_last() },
            // Not a trap: instantiation failed (pool exhausted) or a value was rejected while
            // crossing the boundary (e.g. invalid UTF-8 or a pointer out of bounds).
            None => {
                let message = format!("{e:#}");
                if message.contains("instance") && message.contains("limit") {
                    PolicyError::Instantiate { policy, reason: message }
                } else {
                    PolicyError::Trap { policy, message, last_log: state.log.take_last() }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cap_holds_over_all_memories_together() {
        let mut limiter = CallLimiter::new(16 << 20);
        assert!(limiter.memory_growing(0, 10 << 20, None).unwrap());
        // A second memory of the same store: 20 MiB together.
        assert!(!limiter.memory_growing(0, 10 << 20, None).unwrap());
        assert!(limiter.refused);
        // Growing the first one within the cap is fine.
        assert!(limiter.memory_growing(10 << 20, 16 << 20, None).unwrap());
        assert!(!limiter.memory_growing(16 << 20, (16 << 20) + 65536, None).unwrap());
    }
}
