//! The simulated network: UDP sockets that quinn runs on (its `AsyncUdpSocket`), carrying
//! datagrams between simulated hosts with a latency from their coordinates, and the faults a
//! seed picks: loss, duplication, reordering (jitter), and partitions, one-way ones included.
//!
//! Every datagram gets its arrival time when it is sent, from the sender's virtual clock, and
//! waits in the receiver's inbox until the receiver's clock reaches it. Arrivals are never
//! sooner than [`Network::min_latency`] after sending: that is the lookahead that lets the
//! simulator run hosts one after the other through a window of that length (`crate::host`).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use timeshard_proto::geo::GeoPoint;

use timeshard_store::faulty_disk::SplitMix64;

/// How links misbehave while faults are on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Chance that a datagram is lost.
    pub drop: f64,
    /// Chance that a datagram arrives twice.
    pub duplicate: f64,
    /// Extra delay, uniform in `[0, jitter)`: datagrams overtake one another.
    pub jitter: Duration,
}

/// What the network carried, for the history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub partitioned: u64,
}

#[derive(Debug)]
struct Datagram {
    from: SocketAddr,
    data: Vec<u8>,
}

#[derive(Debug, Default)]
struct Inbox {
    /// (arrival ns, sequence) → datagram; the sequence keeps equal arrivals in sending order.
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slab: HashMap<usize, Datagram>,
    next_slot: usize,
    waker: Option<Waker>,
}

#[derive(Debug)]
struct State {
    rng: SplitMix64,
    seq: u64,
    /// Host of each bound address.
    hosts: HashMap<SocketAddr, usize>,
    inboxes: HashMap<SocketAddr, Inbox>,
    /// Where each host is (for latency).
    locations: Vec<Option<GeoPoint>>,
    /// Directed links cut: (from host, to host).
    cut: BTreeSet<(usize, usize)>,
    faults: LinkFaults,
    stats: NetStats,
}

/// The network every simulated host's sockets share.
pub struct Network {
    state: Mutex<State>,
    min_latency: Duration,
}

impl fmt::Debug for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Network").field("min_latency", &self.min_latency).finish_non_exhaustive()
    }
}

/// One-way delay between two places: light in fibre over a detour, plus a per-hop cost (as the
/// node's WAN emulation computes it).
const PER_HOP_MS: f64 = 0.2;
const ROUTE_FACTOR: f64 = 1.5;

impl Network {
    /// A network whose links take at least `min_latency`, its faults drawn from `seed`.
    pub fn new(seed: u64, min_latency: Duration) -> Arc<Network> {
        Arc::new(Network {
            state: Mutex::new(State {
                rng: SplitMix64(seed),
                seq: 0,
                hosts: HashMap::new(),
                inboxes: HashMap::new(),
                locations: Vec::new(),
                cut: BTreeSet::new(),
                faults: LinkFaults::default(),
                stats: NetStats::default(),
            }),
            min_latency,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shortest one-way delay of any link.
    pub fn min_latency(&self) -> Duration {
        self.min_latency
    }

    /// Places host `host` at `location` (latency follows).
    pub fn set_location(&self, host: usize, location: Option<GeoPoint>) {
        let mut s = self.lock();
        if s.locations.len() <= host {
            s.locations.resize(host + 1, None);
        }
        s.locations[host] = location;
    }

    /// A socket of host `host` at `addr`, on the host's clock (`clock`). Datagrams still on
    /// their way to a previous socket at `addr` are lost (a restarted process).
    pub fn bind(self: &Arc<Self>, host: usize, addr: SocketAddr, clock: HostClock) -> Arc<SimSocket> {
        let mut s = self.lock();
        s.hosts.insert(addr, host);
        s.inboxes.insert(addr, Inbox::default());
        if s.locations.len() <= host {
            s.locations.resize(host + 1, None);
        }
        Arc::new(SimSocket { net: self.clone(), addr, clock, timer: Mutex::new(None) })
    }

    /// Closes `addr`: it neither sends nor receives until bound again (a crashed process).
    pub fn close(&self, addr: SocketAddr) {
        let mut s = self.lock();
        s.inboxes.remove(&addr);
    }

    /// Sets how links misbehave.
    pub fn set_faults(&self, faults: LinkFaults) {
        self.lock().faults = faults;
    }

    /// Cuts the link from host `from` to host `to` (one way).
    pub fn cut(&self, from: usize, to: usize) {
        self.lock().cut.insert((from, to));
    }

    /// Heals every cut link.
    pub fn heal(&self) {
        self.lock().cut.clear();
    }

    /// Whether any link is cut.
    pub fn is_partitioned(&self) -> bool {
        !self.lock().cut.is_empty()
    }

    /// What the network carried so far.
    pub fn stats(&self) -> NetStats {
        self.lock().stats
    }

    fn latency_ns(s: &State, from: usize, to: usize) -> u64 {
        let base = match (s.locations.get(from).copied().flatten(), s.locations.get(to).copied().flatten()) {
            (Some(a), Some(b)) => timeshard_proto::geo::wan_one_way_ms(&a, &b, PER_HOP_MS, ROUTE_FACTOR),
            _ => 0.0,
        };
        (base * 1e6) as u64
    }

    fn send(&self, from_addr: SocketAddr, now: u64, t: &Transmit<'_>) {
        let mut s = self.lock();
        let s = &mut *s;
        s.stats.sent += 1;
        let (Some(&from), Some(&to)) = (s.hosts.get(&from_addr), s.hosts.get(&t.destination)) else {
            s.stats.dropped += 1;
            return;
        };
        if s.cut.contains(&(from, to)) {
            s.stats.partitioned += 1;
            return;
        }
        let faults = s.faults;
        if faults.drop > 0.0 && s.rng.unit() < faults.drop {
            s.stats.dropped += 1;
            return;
        }
        let copies = if faults.duplicate > 0.0 && s.rng.unit() < faults.duplicate {
            s.stats.duplicated += 1;
            2
        } else {
            1
        };
        let base = (self.min_latency.as_nanos() as u64).max(Network::latency_ns(s, from, to));
        for _ in 0..copies {
            let jitter = faults.jitter.as_nanos() as u64;
            let delay = base + if jitter > 0 { s.rng.below(jitter) } else { 0 };
            let seq = s.seq;
            s.seq += 1;
            let Some(inbox) = s.inboxes.get_mut(&t.destination) else {
                s.stats.dropped += 1;
                return;
            };
            let slot = inbox.next_slot;
            inbox.next_slot += 1;
            inbox.slab.insert(slot, Datagram { from: from_addr, data: t.contents.to_vec() });
            inbox.queue.push(Reverse((now + delay, seq, slot)));
            if let Some(w) = inbox.waker.take() {
                w.wake();
            }
        }
    }
}

/// A host's virtual clock as its sockets read it: the simulation's time in ns is `origin_ns`
/// plus how far the host runtime's clock is past `origin`.
#[derive(Clone, Copy, Debug)]
pub struct HostClock {
    pub origin: tokio::time::Instant,
    pub origin_ns: u64,
}

impl HostClock {
    /// The simulation's time on this host, now.
    pub fn now_ns(&self) -> u64 {
        self.origin_ns + tokio::time::Instant::now().saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// The host runtime's instant at simulation time `ns`.
    pub fn instant_at(&self, ns: u64) -> tokio::time::Instant {
        self.origin + Duration::from_nanos(ns.saturating_sub(self.origin_ns))
    }
}

/// A simulated UDP socket.
pub struct SimSocket {
    net: Arc<Network>,
    addr: SocketAddr,
    clock: HostClock,
    /// Wakes the receiver when the next datagram arrives.
    timer: Mutex<Option<Pin<Box<tokio::time::Sleep>>>>,
}

impl fmt::Debug for SimSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSocket").field("addr", &self.addr).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for SimSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.net.send(self.addr, self.clock.now_ns(), transmit);
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let now = self.clock.now_ns();
        let next = {
            let mut s = self.net.lock();
            let s = &mut *s;
            let Some(inbox) = s.inboxes.get_mut(&self.addr) else { return Poll::Pending };
            let mut n = 0;
            while n < bufs.len().min(meta.len()) {
                match inbox.queue.peek() {
                    Some(Reverse((at, _, _))) if *at <= now => {}
                    _ => break,
                }
                let Some(Reverse((_, _, slot))) = inbox.queue.pop() else { break };
                let Some(d) = inbox.slab.remove(&slot) else { continue };
                let len = d.data.len().min(bufs[n].len());
                bufs[n][..len].copy_from_slice(&d.data[..len]);
                meta[n] = RecvMeta { addr: d.from, len, stride: len, ecn: None, dst_ip: None };
                n += 1;
            }
            if n > 0 {
                s.stats.delivered += n as u64;
                return Poll::Ready(Ok(n));
            }
            inbox.waker = Some(cx.waker().clone());
            inbox.queue.peek().map(|Reverse((at, _, _))| *at)
        };
        if let Some(at) = next {
            let deadline = self.clock.instant_at(at);
            let mut timer = self.timer.lock().unwrap_or_else(|e| e.into_inner());
            match timer.as_mut() {
                Some(t) if t.deadline() == deadline => {}
                Some(t) => t.as_mut().reset(deadline),
                None => *timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            if let Some(t) = timer.as_mut()
                && t.as_mut().poll(cx).is_ready()
            {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }

    fn may_fragment(&self) -> bool {
        false
    }
}
