//! What the read path shares with repair: whether this node is settled (holds every block it
//! owns), whether it is leaving, the counters `timeshard status` shows, and the bounded queue of
//! read repairs. A leaf: the coordinator and the replica read it, the repair tasks write it, and
//! it imports nothing of the node.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use timeshard_proto::Contact;
use timeshard_proto::repair::{LeaveProgress, RepairStatus};
use timeshard_proto::wire::BlockPoints;
use tokio::sync::mpsc;

/// Counters of repair work since the node started.
#[derive(Debug, Default)]
pub struct Counters {
    pub rounds: AtomicU64,
    pub sessions: AtomicU64,
    pub sessions_served: AtomicU64,
    pub compare_bytes: AtomicU64,
    pub blocks_fetched: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub handoff_pending: AtomicU64,
    pub handoff_blocks_pushed: AtomicU64,
    pub handoff_bytes_pushed: AtomicU64,
    pub handoff_blocks_dropped: AtomicU64,
    pub read_repairs_sent: AtomicU64,
    pub read_repairs_dropped: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, n: u64) {
        gauge.store(n, Ordering::Relaxed);
    }
}

/// What the read path and the repair tasks share.
#[derive(Debug)]
pub struct RepairState {
    settled: AtomicBool,
    leaving: AtomicBool,
    leave: Mutex<LeaveProgress>,
    pub counters: Counters,
    read_repairs: ReadRepairs,
}

impl RepairState {
    /// The repair state of a node that has just started: unsettled (it may have missed writes
    /// while it was away, or own blocks it never held) until its first catch-up round, with
    /// room for `read_repair_queue` read repairs.
    pub fn new(read_repair_queue: usize) -> RepairState {
        RepairState {
            settled: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            leave: Mutex::new(LeaveProgress::default()),
            counters: Counters::default(),
            read_repairs: ReadRepairs::new(read_repair_queue),
        }
    }

    /// Whether this node holds every block it owns: its replica answers say so, and reads
    /// count only such answers towards R.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    pub fn set_settled(&self, settled: bool) {
        self.settled.store(settled, Ordering::Release);
    }

    /// Whether this node is leaving the cluster.
    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Acquire)
    }

    /// Marks the node as leaving; returns whether it was not already.
    pub fn start_leaving(&self) -> bool {
        !self.leaving.swap(true, Ordering::AcqRel)
    }

    /// Where a graceful leave stands.
    pub fn leave_progress(&self) -> LeaveProgress {
        *self.leave.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn update_leave(&self, f: impl FnOnce(&mut LeaveProgress)) {
        f(&mut self.leave.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The read repairs waiting to be sent.
    pub fn read_repairs(&self) -> &ReadRepairs {
        &self.read_repairs
    }

    /// Queues the points `block` holds for `target`, which lacked them; counts it as dropped
    /// when the queue is full.
    pub fn read_repair(&self, target: Contact, block: BlockPoints) {
        if !self.read_repairs().offer(ReadRepair { target, block }) {
            Counters::add(&self.counters.read_repairs_dropped, 1);
        }
    }

    /// What `timeshard status` shows of repair.
    pub fn status(&self) -> RepairStatus {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RepairStatus {
            settled: self.is_settled(),
            leaving: self.is_leaving(),
            rounds: get(&c.rounds),
            sessions: get(&c.sessions),
            sessions_served: get(&c.sessions_served),
            compare_bytes: get(&c.compare_bytes),
            blocks_fetched: get(&c.blocks_fetched),
            bytes_fetched: get(&c.bytes_fetched),
            handoff_pending: get(&c.handoff_pending),
            handoff_blocks_pushed: get(&c.handoff_blocks_pushed),
            handoff_bytes_pushed: get(&c.handoff_bytes_pushed),
            handoff_blocks_dropped: get(&c.handoff_blocks_dropped),
            read_repairs_sent: get(&c.read_repairs_sent),
            read_repairs_dropped: get(&c.read_repairs_dropped),
            leave: self.leave_progress(),
        }
    }
}

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
