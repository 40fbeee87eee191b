//! The node's one memory budget (`[memory] budget`): how it is split between open points,
//! caches, policy pools and queues, the settings derived from each share, and the admission of
//! client writes against it.
//!
//! Request frames are charged too, as their bytes arrive and before their buffer grows
//! ([`FrameCharge`]): a client's frame is refused with the same retryable error when frames
//! being read would take more than the queues' share; a peer's is counted but never refused, so
//! clients cannot starve replication and repair of memory.
//!
//! Past the budget the node sheds load instead of growing: a client write is refused with a
//! retryable `Overloaded` "memory budget exceeded" error when the writes in flight would take
//! more than the queues' share, or when the process's resident memory is already past the
//! budget and a quarter more ([`Shares::resident_ceiling`]: a backstop for what the accounting
//! does not see, such as the store's block index). Nothing is acknowledged that is not stored; reads, replica traffic and repair go on.
//! HTTP request bodies are charged at their declared length before they are read, on their
//! own account within the queues' share ([`Ledger::admit_body`]).
//!
//! The accounting ([`Ledger`]) is sans-IO: the caller measures resident memory
//! ([`resident_bytes`]) and passes it in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use timeshard_proto::wire::{ErrorCode, ErrorReply};

// The `[memory]` section lives with the rest of the configuration (a leaf); these were its
// paths before, and tests and the testkit still name them here.
pub use crate::config::{ByteSize, MIN_BUDGET, MemoryConfig};

/// Bytes one open (unsealed) point takes in the store's memory: the point and its share of
/// the block's vector and map entries.
pub const OPEN_POINT_BYTES: u64 = 32;
/// Bytes a point of a client write takes while it is in flight (decoded, copied per replica
/// request, answers): a generous bound.
pub const IN_FLIGHT_POINT_BYTES: u64 = 96;

/// The budget split by what uses it, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    /// The whole budget.
    pub total: u64,
    /// Open points of the store (3/8): sealed early when they would take more.
    pub open_points: u64,
    /// Caches (1/8): the series and index spans the coordinator remembers, file handles.
    pub caches: u64,
    /// Policy pools (1/4): instances × their memory cap.
    pub policies: u64,
    /// Queues (1/4): client writes in flight and the replica writes they start.
    pub queues: u64,
}

impl Shares {
    pub fn of(total: u64) -> Shares {
        let eighth = total / 8;
        Shares { total, open_points: 3 * eighth, caches: eighth, policies: 2 * eighth, queues: 2 * eighth }
    }

    /// Most open points the store may hold.
    pub fn max_open_points(&self) -> usize {
        usize::try_from(self.open_points / OPEN_POINT_BYTES).unwrap_or(usize::MAX).max(1024)
    }

    /// Resident memory past which client writes are refused whatever the accounting says: the
    /// budget and a quarter more. The shares bound what the node accounts for (open points,
    /// writes and bodies in flight, policy pools, caches); this backstop catches what it does
    /// not (the store's block index, the allocator's own pages, buffers of the runtime).
    pub fn resident_ceiling(&self) -> u64 {
        self.total.saturating_add(self.total / 4)
    }

    /// Policy instances that fit the policies' share at `memory_bytes` each (at least one).
    pub fn policy_instances(&self, memory_bytes: u64) -> u32 {
        u32::try_from(self.policies / memory_bytes.max(1)).unwrap_or(u32::MAX).max(1)
    }

    /// Entries the coordinator's caches of known series and index spans may hold.
    pub fn cache_entries(&self) -> usize {
        // A series key with its map entry: about 256 bytes.
        usize::try_from(self.caches / 256).unwrap_or(usize::MAX).max(1024)
    }

    /// The QUIC receive windows the queues' share allows. Bytes a peer or client has sent that
    /// the node has not read yet wait in quinn's buffers, up to a connection's window: a
    /// stream's bytes behind a gap the sender leaves open cannot be read at all until the
    /// request times out. They are request bytes the frames' account does not see yet, so
    /// every allowed connection's window together stays within the queues' share: half of it
    /// is every connection's first window (`connections`: those the node accepts and those it
    /// dials), the other half is shared out as larger windows among the connections admitted
    /// or dialed, a quarter for peers and a quarter for clients ([`ReceiveWindows`]).
    ///
    /// The number of streams does not change the bound: they share their connection's window
    /// (the sum of every stream's received bytes counts against it).
    pub fn receive_windows(&self, connections: usize, max_message_bytes: u32) -> ReceiveWindows {
        let half = self.queues / 2;
        // As before windows came from the budget: room for a few whole messages.
        let largest = u64::from(max_message_bytes).saturating_mul(4).min(u64::from(u32::MAX)).max(MIN_WINDOW);
        let initial = (half / connections.max(1) as u64).clamp(MIN_WINDOW, largest);
        let granted = (half / WINDOW_GRANTS).clamp(initial, largest);
        let stream = granted.min(u64::from(max_message_bytes) + 8);
        ReceiveWindows { initial, granted, pool_per_role: half / 2, stream }
    }
}

/// Least receive window of a QUIC connection: a few packets. Past
/// `queues / 2 / MIN_WINDOW` allowed connections (8192 at the default budget), the first
/// windows together outgrow their half of the queues' share.
pub const MIN_WINDOW: u64 = 4 << 10;
/// Connections, peers and clients together, that get the largest window the budget allows
/// (512 KiB at the default budget: about 10 MB/s per connection across 50 ms, far more on a
/// LAN); more share the same bytes in smaller windows.
const WINDOW_GRANTS: u64 = 64;

/// QUIC receive windows ([`Shares::receive_windows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveWindows {
    /// Every connection's window from its first packet (the transport's `receive_window`).
    pub initial: u64,
    /// The largest window a connection the node admitted or dialed gets: while few connections
    /// of its role share the pool.
    pub granted: u64,
    /// Bytes of window beyond the first ones that peers' connections share, and clients' apart
    /// from them ([`ReceiveWindows::shared`]).
    pub pool_per_role: u64,
    /// One stream's window (`stream_receive_window`): a whole message, at most a granted window.
    pub stream: u64,
}

impl ReceiveWindows {
    /// Bytes every connection's window may hold together, at most: `connections` first
    /// windows, and both roles' pools.
    pub fn bound(&self, connections: usize) -> u64 {
        (connections as u64).saturating_mul(self.initial).saturating_add(2 * self.pool_per_role)
    }

    /// The window of each of the connections of one role that share its pool `step` ways (a
    /// power of two, at least their number): the pool split evenly, between the first window
    /// and the largest.
    pub fn shared(&self, step: usize) -> u64 {
        let extra = self.pool_per_role / step.max(1) as u64;
        self.initial + extra.min(self.granted - self.initial)
    }
}

/// How many ways one role's pool of window bytes is split ([`ReceiveWindows::shared`]): the
/// number of connections rounded up to a power of two, so that windows change only when the
/// count doubles, or falls to a quarter (connections that come and go near a boundary do not
/// resize every other connection's window each time). Sans-IO: the endpoint applies a change
/// to every connection of the role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowSplit {
    step: usize,
}

impl WindowSplit {
    /// The split now.
    pub fn step(&self) -> usize {
        self.step.max(1)
    }

    /// The role now has `holders` connections: the new split if every window must change.
    pub fn resize(&mut self, holders: usize) -> Option<usize> {
        let grow = holders > self.step();
        let shrink = self.step() > 1 && holders <= self.step() / 4;
        if !grow && !shrink {
            return None;
        }
        self.step = holders.max(1).next_power_of_two();
        Some(self.step)
    }
}

/// Why a write was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetExceeded {
    #[error(
        "memory budget exceeded: writes in flight would take {wanted} bytes of the {share} bytes the budget ({total}) \
         gives queues; retry later"
    )]
    Queues { wanted: u64, share: u64, total: ByteSize },
    #[error(
        "memory budget exceeded: request frames being read would take {wanted} bytes of the {share} bytes the budget \
         ({total}) gives queues; retry later"
    )]
    Frames { wanted: u64, share: u64, total: ByteSize },
    #[error(
        "memory budget exceeded: request bodies being read would take {wanted} bytes of the {share} bytes the budget \
         ({total}) gives them; retry later, or send smaller bodies"
    )]
    Bodies { wanted: u64, share: u64, total: ByteSize },
    #[error(
        "memory budget exceeded: the node holds {resident} bytes resident, past its budget of {total} and the \
         quarter more it may hold; retry later (or raise [memory] budget)"
    )]
    Resident { resident: u64, total: ByteSize },
    #[error(
        "memory budget exceeded: the node holds {resident} bytes resident, and {wanted} bytes more for a request body \
         would pass its budget of {total} and the quarter more it may hold; retry later, or send smaller bodies"
    )]
    ResidentWithBody { resident: u64, wanted: u64, total: ByteSize },
    #[error(
        "memory budget exceeded: answers being streamed would take {wanted} bytes of the {share} bytes the budget \
         ({total}) gives them; retry later"
    )]
    Answers { wanted: u64, share: u64, total: ByteSize },
}

impl From<BudgetExceeded> for ErrorReply {
    fn from(e: BudgetExceeded) -> ErrorReply {
        ErrorReply::new(ErrorCode::Overloaded, e.to_string())
    }
}

/// What client writes and the request bodies being read hold of the budget right now.
#[derive(Debug)]
pub struct Ledger {
    shares: Shares,
    in_flight: AtomicU64,
    /// Bytes of request bodies (HTTP) being read or decoded: charged before they are read,
    /// at their declared length, against the queues' share like the writes they become.
    bodies: AtomicU64,
    refused: AtomicU64,
    /// Bytes of request frames being read or waiting to be decoded.
    frames: AtomicU64,
    /// Bytes of answers being streamed (HTTP raw reads): a few batches each, charged for the
    /// answer's life on their own account within the queues' share.
    answers: AtomicU64,
}

/// The bytes one request frame holds of the budget, grown as it is read ([`FrameCharge::grow`])
/// and given back when dropped.
#[derive(Debug)]
pub struct FrameCharge<'a> {
    ledger: &'a Ledger,
    bytes: u64,
    /// A peer's frame: counted, never refused.
    peer: bool,
}

impl FrameCharge<'_> {
    /// Takes `more` bytes for this frame, or says why not (a client's frame only): past the
    /// queues' share, unless this frame is the only one holding any (a frame within the message
    /// limit must be readable on an idle node).
    pub fn grow(&mut self, more: u64) -> Result<(), BudgetExceeded> {
        let share = self.ledger.shares.queues;
        let mine = self.bytes;
        let peer = self.peer;
        let grown = self.ledger.frames.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            let wanted = held.saturating_add(more);
            (peer || held == mine || wanted <= share).then_some(wanted)
        });
        match grown {
            Ok(_) => {
                self.bytes += more;
                Ok(())
            }
            Err(held) => {
                self.ledger.refused.fetch_add(1, Ordering::Relaxed);
                Err(BudgetExceeded::Frames {
                    wanted: held.saturating_add(more),
                    share,
                    total: ByteSize(self.ledger.shares.total),
                })
            }
        }
    }

    /// Bytes this frame holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for FrameCharge<'_> {
    fn drop(&mut self) {
        self.ledger.frames.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Bytes of one admitted write or body, given back when dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    held: &'a AtomicU64,
    bytes: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The account of the ledger an owned charge holds bytes of.
#[derive(Clone, Copy, Debug)]
enum Account {
    Bodies,
    Answers,
}

/// Bytes of a request body or a streamed answer admitted on a shared ledger, given back when
/// dropped.
#[derive(Debug)]
pub struct OwnedAdmitted {
    ledger: Arc<Ledger>,
    account: Account,
    bytes: u64,
}

impl Drop for OwnedAdmitted {
    fn drop(&mut self) {
        self.ledger.account(self.account).fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Takes `bytes` more of `held` within `share`; one alone is always let through when nothing
/// else is held, so a request within the other limits is servable on an idle node.
fn take(held: &AtomicU64, bytes: u64, share: u64) -> Result<Admitted<'_>, u64> {
    held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
        let wanted = h.saturating_add(bytes);
        (h == 0 || wanted <= share).then_some(wanted)
    })
    .map(|_| Admitted { held, bytes })
    .map_err(|h| h.saturating_add(bytes))
}

impl Ledger {
    pub fn new(shares: Shares) -> Ledger {
        Ledger {
            shares,
            in_flight: AtomicU64::new(0),
            bodies: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            answers: AtomicU64::new(0),
        }
    }

    /// A charge for one request frame, holding nothing yet; `peer` when a node sends it.
    pub fn frame(&self, peer: bool) -> FrameCharge<'_> {
        FrameCharge { ledger: self, bytes: 0, peer }
    }

    /// Bytes of request frames being read or waiting to be decoded.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Acquire)
    }

    /// Admits a request body of `bytes` (its declared length, or the body limit when it does
    /// not declare one) before it is read, given the process's `resident` bytes: refused when
    /// those bytes on top of what is resident would pass the budget, since they are charged
    /// before they are allocated (a check of `resident` alone lets every body admitted just
    /// under the budget grow past it).
    pub fn admit_body(&self, bytes: u64, resident: u64) -> Result<Admitted<'_>, BudgetExceeded> {
        self.admit_body_counting(bytes, resident, true)
    }

    /// [`Ledger::admit_body`] for a body that will ask again: a refusal is not counted.
    pub fn try_admit_body(&self, bytes: u64, resident: u64) -> Result<Admitted<'_>, BudgetExceeded> {
        self.admit_body_counting(bytes, resident, false)
    }

    fn admit_body_counting(&self, bytes: u64, resident: u64, count: bool) -> Result<Admitted<'_>, BudgetExceeded> {
        let total = ByteSize(self.shares.total);
        let refused = |e| {
            if count {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(e)
        };
        let ceiling = self.shares.resident_ceiling();
        if resident > ceiling {
            return refused(BudgetExceeded::Resident { resident, total });
        }
        if resident.saturating_add(bytes) > ceiling {
            return refused(BudgetExceeded::ResidentWithBody { resident, wanted: bytes, total });
        }
        let share = self.shares.queues;
        take(&self.bodies, bytes, share).or_else(|wanted| refused(BudgetExceeded::Bodies { wanted, share, total }))
    }

    fn account(&self, account: Account) -> &AtomicU64 {
        match account {
            Account::Bodies => &self.bodies,
            Account::Answers => &self.answers,
        }
    }

    /// `admitted` (taken on `account`) as a charge that holds the ledger.
    fn owned(self: &Arc<Self>, admitted: Admitted<'_>, account: Account) -> OwnedAdmitted {
        let bytes = admitted.bytes;
        // Given back by the owned charge instead.
        std::mem::forget(admitted);
        OwnedAdmitted { ledger: self.clone(), account, bytes }
    }

    /// [`Ledger::admit_body`] for work on another thread: the charge holds the ledger.
    pub fn admit_body_owned(self: &Arc<Self>, bytes: u64, resident: u64) -> Result<OwnedAdmitted, BudgetExceeded> {
        let admitted = self.admit_body(bytes, resident)?;
        Ok(self.owned(admitted, Account::Bodies))
    }

    /// [`Ledger::admit_body_owned`] for a body that will ask again: a refusal is not counted.
    pub fn try_admit_body_owned(self: &Arc<Self>, bytes: u64, resident: u64) -> Result<OwnedAdmitted, BudgetExceeded> {
        let admitted = self.try_admit_body(bytes, resident)?;
        Ok(self.owned(admitted, Account::Bodies))
    }

    /// Admits an answer that streams while holding at most `bytes`, for as long as the charge
    /// lives. Resident memory is not checked: reads go on past the budget (they free what they
    /// take), bounded by what streamed answers hold together.
    pub fn admit_answer(self: &Arc<Self>, bytes: u64) -> Result<OwnedAdmitted, BudgetExceeded> {
        let share = self.shares.queues;
        match take(&self.answers, bytes, share) {
            Ok(admitted) => Ok(self.owned(admitted, Account::Answers)),
            Err(wanted) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(BudgetExceeded::Answers { wanted, share, total: ByteSize(self.shares.total) })
            }
        }
    }

    /// Bytes of streamed answers admitted and not yet given back.
    pub fn answers(&self) -> u64 {
        self.answers.load(Ordering::Acquire)
    }

    /// Bytes of request bodies admitted and not yet given back.
    pub fn bodies(&self) -> u64 {
        self.bodies.load(Ordering::Acquire)
    }

    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// Admits a client write of `points`, given the process's `resident` bytes, or says why not.
    pub fn admit(&self, points: u64, resident: u64) -> Result<Admitted<'_>, BudgetExceeded> {
        let total = ByteSize(self.shares.total);
        if resident > self.shares.resident_ceiling() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(BudgetExceeded::Resident { resident, total });
        }
        let bytes = points.saturating_mul(IN_FLIGHT_POINT_BYTES);
        let share = self.shares.queues;
        take(&self.in_flight, bytes, share).map_err(|wanted| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            BudgetExceeded::Queues { wanted, share, total }
        })
    }

    /// Bytes of client writes in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Writes and request frames refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The memory the process holds, in bytes: its resident pages less those backed by files or
/// shared memory (Linux: `/proc/self/statm`, resident minus shared, about `RssAnon`). The
/// executable's mapped code is resident too but is the kernel's to drop and reload, not
/// something the node holds (a debug node of the tier scenario was refused writes at 483 MB
/// resident, code included). 0 where unknown, which leaves only the queue accounting.
pub fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let mut fields = statm.split_whitespace().skip(1).map(|p| p.parse::<u64>().unwrap_or(0));
    let (resident, shared) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
    resident.saturating_sub(shared).saturating_mul(page_size())
}

/// How old a resident-memory sample may be before a write reads it again.
const RESIDENT_SAMPLE_MS: u64 = 50;

/// [`resident_bytes`], read at most once every 50 ms however many writes ask: reading
/// `/proc/self/statm` costs a few system calls, too many for every small write.
pub fn recent_resident_bytes() -> u64 {
    // A simulated fleet shares one process: its resident memory is no one node's.
    if timeshard_clock::sim::active() {
        return 0;
    }
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    static SAMPLED_AT_MS: AtomicU64 = AtomicU64::new(0);
    static SAMPLE: AtomicU64 = AtomicU64::new(0);
    let now_ms = u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
    let at = SAMPLED_AT_MS.load(Ordering::Acquire);
    if at != 0 && now_ms.saturating_sub(at) < RESIDENT_SAMPLE_MS {
        return SAMPLE.load(Ordering::Acquire);
    }
    let bytes = resident_bytes();
    SAMPLE.store(bytes, Ordering::Release);
    SAMPLED_AT_MS.store(now_ms, Ordering::Release);
    bytes
}

fn page_size() -> u64 {
    // Every Linux target the node builds for (x86_64, aarch64, armv7) uses 4 KiB pages by
    // default; /proc/self/smaps would say otherwise, but reading it costs far more.
    4096
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read from /proc/self/status: `field` in bytes.
    fn status_bytes(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[test]
    fn resident_memory_leaves_out_the_mapped_executable() {
        // This test binary's code (wasmtime, the node) is resident and file-backed: the budget
        // must not count it as memory the node holds.
        let held = resident_bytes();
        let (anon, file) = (status_bytes("RssAnon:"), status_bytes("RssFile:"));
        assert!(file > 0 && held > 0, "RssFile {file}, held {held}");
        assert!(held <= anon + (4 << 20), "held {held} against RssAnon {anon} (RssFile {file})");
    }

    #[test]
    fn the_shares_add_up_to_the_budget() {
        let s = Shares::of(256 << 20);
        assert_eq!(s.open_points + s.caches + s.policies + s.queues, s.total);
        assert_eq!(s.max_open_points(), (96 << 20) / 32);
        assert_eq!(s.policy_instances(16 << 20), 4);
        assert_eq!(s.policy_instances(1 << 30), 1, "at least one instance");
    }

    #[test]
    fn quic_receive_windows_stay_within_the_queues_share() {
        let limits = crate::config::LimitsConfig::default();
        let connections = 2 * limits.max_connections;
        let message = limits.max_message_bytes;
        // The default budget: 4 KiB first windows for 8,192 connections, 512 KiB windows for up
        // to 32 connections of a role.
        let s = Shares::of(256 << 20);
        let w = s.receive_windows(connections, message);
        assert_eq!(
            w,
            ReceiveWindows { initial: 4 << 10, granted: 512 << 10, pool_per_role: 16 << 20, stream: 512 << 10 }
        );
        assert_eq!(w.shared(32), 512 << 10);
        assert!(w.bound(connections) <= s.queues, "{} of {}", w.bound(connections), s.queues);
        // What it was before: 64 MiB a connection, 4096 connections a node (256 GiB).
        assert!(w.bound(connections) <= u64::from(message) * 4);
        // Larger budgets give larger windows, never past four whole messages; the bound holds
        // at every budget where the first windows are above their floor.
        for budget_mib in [4u64, 16, 64, 256, 1024, 4096, 65536] {
            let s = Shares::of(budget_mib << 20);
            for conns in [1, 64, 1024, connections, 100_000] {
                let w = s.receive_windows(conns, message);
                assert!(w.initial >= MIN_WINDOW && w.initial <= w.granted, "{budget_mib} MiB, {conns}: {w:?}");
                assert!(w.granted <= u64::from(message) * 4, "{budget_mib} MiB, {conns}: {w:?}");
                assert!(w.stream <= w.granted && w.stream <= u64::from(message) + 8, "{w:?}");
                assert!(2 * w.pool_per_role <= s.queues / 2, "{budget_mib} MiB, {conns}: {w:?}");
                if s.queues / 2 / conns as u64 >= MIN_WINDOW {
                    assert!(w.bound(conns) <= s.queues, "{budget_mib} MiB, {conns}: {} > {}", w.bound(conns), s.queues);
                }
            }
        }
        let big = Shares::of(64 << 30).receive_windows(connections, message);
        assert_eq!(big.granted, u64::from(message) * 4, "capped at four messages");
        assert!(big.initial >= 1 << 20, "{big:?}");
        // A small message limit caps streams at one message.
        assert_eq!(Shares::of(256 << 20).receive_windows(16, 65_536).stream, 65_536 + 8);
    }

    /// Before, each role had 32 fixed grants: the 33rd connection of a role (an 18-node
    /// cluster where every pair dials both ways has 34 peer connections) was left at a 4 KiB
    /// window. Now every connection of the role shares the pool, and all of them together
    /// stay within it.
    #[test]
    fn every_admitted_connection_shares_its_roles_window_pool() {
        let limits = crate::config::LimitsConfig::default();
        let w = Shares::of(256 << 20).receive_windows(2 * limits.max_connections, limits.max_message_bytes);
        let mut split = WindowSplit::default();
        let mut windows = Vec::new();
        for holders in 1..=limits.max_connections {
            split.resize(holders);
            assert!(split.step() >= holders, "{holders} connections split {} ways", split.step());
            let each = w.shared(split.step());
            assert!(holders as u64 * (each - w.initial) <= w.pool_per_role, "{holders} x {each}");
            windows.push(each);
        }
        assert_eq!(windows[31], 512 << 10, "32 connections get the largest window");
        assert_eq!(windows[33], (4 << 10) + (256 << 10), "the 34th gets a share, not the first window");
        assert!(windows[1023] > w.initial, "{}", windows[1023]);
        assert!(windows.windows(2).all(|p| p[1] <= p[0]), "more connections, smaller windows");
    }

    /// Windows change for the whole role only when the count doubles or falls to a quarter:
    /// a connection coming and going at a boundary does not resize the others each time.
    #[test]
    fn the_split_changes_only_when_the_count_doubles_or_falls_to_a_quarter() {
        let mut split = WindowSplit::default();
        assert_eq!(split.resize(1), None, "one connection: the whole pool, as before any");
        assert_eq!(split.resize(2), Some(2));
        assert_eq!(split.resize(3), Some(4));
        assert_eq!(split.resize(4), None);
        assert_eq!(split.resize(5), Some(8));
        for _ in 0..10 {
            assert_eq!(split.resize(4), None, "back under a boundary: kept");
            assert_eq!(split.resize(5), None);
        }
        assert_eq!(split.resize(2), Some(2), "a quarter: the windows grow again");
        assert_eq!(split.resize(1), None, "a half: kept");
        assert_eq!(split.step(), 2);
    }

    #[test]
    fn writes_past_the_queue_share_are_refused_until_others_finish() {
        let ledger = Ledger::new(Shares::of(8 * 1000 * IN_FLIGHT_POINT_BYTES));
        // Queues get a quarter: 2,000 points' worth.
        let first = ledger.admit(1_500, 0).unwrap();
        assert_eq!(ledger.in_flight(), 1_500 * IN_FLIGHT_POINT_BYTES);
        let err = ledger.admit(1_000, 0).unwrap_err();
        assert!(matches!(err, BudgetExceeded::Queues { .. }));
        assert!(err.to_string().starts_with("memory budget exceeded"), "{err}");
        let small = ledger.admit(500, 0).unwrap();
        drop(first);
        drop(small);
        assert_eq!(ledger.in_flight(), 0, "admitted bytes are given back");
        // Alone, even a write larger than the share goes through.
        let big = ledger.admit(10_000, 0).unwrap();
        drop(big);
        assert_eq!(ledger.refused(), 1);
    }

    #[test]
    fn bodies_are_charged_apart_from_writes_within_the_queue_share() {
        let ledger = Ledger::new(Shares::of(8 << 20));
        // Queues get 2 MiB.
        let big = ledger.admit_body(3 << 20, 0).unwrap();
        let err = ledger.admit_body(1, 0).unwrap_err();
        assert!(
            matches!(err, BudgetExceeded::Bodies { wanted, share, .. } if wanted == (3 << 20) + 1 && share == 2 << 20)
        );
        assert!(err.to_string().contains("request bodies"), "{err}");
        // The points such a body becomes are admitted on their own account.
        drop(ledger.admit(1000, 0).unwrap());
        drop(big);
        assert_eq!(ledger.bodies(), 0);
        let a = ledger.admit_body(1 << 20, 0).unwrap();
        let b = ledger.admit_body(1 << 20, 0).unwrap();
        assert!(ledger.admit_body(1, 0).is_err());
        drop((a, b));
        assert!(matches!(ledger.admit_body(1, 11 << 20), Err(BudgetExceeded::Resident { .. })));
        // What a body takes counts on top of what is resident: 9 MiB + 2 MiB is past the 10 MiB
        // that a budget of 8 MiB and a quarter more allow.
        let err = ledger.admit_body(2 << 20, 9 << 20).unwrap_err();
        assert!(matches!(err, BudgetExceeded::ResidentWithBody { wanted, .. } if wanted == 2 << 20), "{err}");
        assert!(err.to_string().contains("2097152 bytes more for a request body"), "{err}");
        drop(ledger.admit_body(1 << 20, 9 << 20).unwrap());
        assert_eq!(ledger.refused(), 4);
        let shared = Arc::new(ledger);
        let owned = shared.admit_body_owned(2 << 20, 0).unwrap();
        assert!(shared.admit_body_owned(1, 0).is_err());
        drop(owned);
        assert_eq!(shared.bodies(), 0, "an owned charge is given back too");
    }

    #[test]
    fn streamed_answers_are_charged_for_their_life_apart_from_bodies() {
        let ledger = Arc::new(Ledger::new(Shares::of(8 << 20)));
        // Queues get 2 MiB; one answer alone always streams.
        let big = ledger.admit_answer(3 << 20).unwrap();
        let err = ledger.admit_answer(1).unwrap_err();
        assert!(matches!(err, BudgetExceeded::Answers { wanted, .. } if wanted == (3 << 20) + 1), "{err}");
        assert!(err.to_string().contains("answers being streamed"), "{err}");
        // Bodies and writes have their own accounts.
        drop(ledger.admit_body(1 << 20, 0).unwrap());
        drop(big);
        assert_eq!(ledger.answers(), 0);
        let a = ledger.admit_answer(1 << 20).unwrap();
        let b = ledger.admit_answer(1 << 20).unwrap();
        assert!(ledger.admit_answer(1).is_err());
        drop(a);
        assert_eq!(ledger.answers(), 1 << 20);
        drop(b);
        assert_eq!(ledger.refused(), 2);
    }

    #[test]
    fn a_node_past_its_budget_and_a_quarter_refuses_writes_with_a_retryable_error() {
        let ledger = Ledger::new(Shares::of(64 << 20));
        assert_eq!(ledger.shares().resident_ceiling(), 80 << 20);
        let err = ledger.admit(1, 81 << 20).unwrap_err();
        assert!(matches!(err, BudgetExceeded::Resident { .. }));
        let reply: ErrorReply = err.into();
        assert_eq!(reply.code, ErrorCode::Overloaded);
        assert!(reply.code.is_replica_fault(), "Overloaded is retryable");
        assert!(
            reply.message.contains("memory budget exceeded") && reply.message.contains("64MiB"),
            "{}",
            reply.message
        );
        assert_eq!(ledger.in_flight(), 0);
        // Resident memory between the budget and the ceiling is left to the accounting.
        ledger.admit(1, 79 << 20).unwrap();
    }

    #[test]
    fn client_frames_past_the_queue_share_are_refused_and_peer_frames_are_not() {
        // Queues get a quarter: 1 MiB.
        let ledger = Ledger::new(Shares::of(4 << 20));
        let mut alone = ledger.frame(false);
        // Alone, a frame grows past the share (a maximum-size message must be readable).
        alone.grow(3 << 19).unwrap();
        assert_eq!(ledger.frames(), 3 << 19);
        let mut second = ledger.frame(false);
        let err = second.grow(64 << 10).unwrap_err();
        assert!(matches!(err, BudgetExceeded::Frames { .. }), "{err}");
        assert!(err.to_string().contains("request frames being read"), "{err}");
        assert_eq!(ErrorReply::from(err).code, ErrorCode::Overloaded);
        // A peer's frame is counted, never refused.
        let mut peer = ledger.frame(true);
        peer.grow(16 << 20).unwrap();
        assert_eq!(ledger.frames(), (3 << 19) + (16 << 20));
        drop((alone, peer));
        second.grow(64 << 10).unwrap();
        assert_eq!(second.bytes(), 64 << 10);
        drop(second);
        assert_eq!(ledger.frames(), 0, "charged bytes are given back");
        assert_eq!(ledger.refused(), 1);
    }

    #[test]
    fn resident_memory_is_measured() {
        if cfg!(target_os = "linux") {
            let rss = resident_bytes();
            assert!(rss > 1 << 20 && rss < 16 << 30, "{rss}");
            let recent = recent_resident_bytes();
            assert!(recent > 1 << 20 && recent < 16 << 30, "{recent}");
        }
    }
}
