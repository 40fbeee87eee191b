//! The clients: tasks on a host of their own that write live points through the SDK, over the
//! simulated network, to whichever nodes are up, replaying a write that got no answer to
//! another node (writes are idempotent), and read the newest point of context-of-interest
//! series from inside their context. Every operation is recorded, with when it began and
//! ended, in the history.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::tls::Identity;
use timeshard_sdk::{Client, ClientOptions};

use crate::fleet::CLIENT_LOCATION;
use crate::history::{Event, Pt, Window};
use crate::net::HostClock;

/// The series the clients write: DHT-placed ones and Atlanta's context-of-interest ones.
pub fn series() -> Vec<SeriesKey> {
    let mut out: Vec<SeriesKey> = (0..4)
        .map(|i| if i < 2 { format!("m.load{{dev=d{i}}}") } else { format!("m.cold{{dev=d{i}}}") })
        .map(|s| s.parse().expect("valid"))
        .collect();
    out.extend((0..3).map(|i| format!("traffic.speed{{geohash=dn5bpsb,seg={i}}}").parse().expect("valid")));
    out
}

/// Every timestamp a client can write: a day around the simulation's epoch (clocks may be
/// skewed or jump by a minute).
pub fn written_range() -> TimeRange {
    let start = crate::run::EPOCH_NS - 3_600_000_000_000;
    TimeRange::new(start, start + 24 * 3_600_000_000_000).expect("a day is a valid range")
}

/// Whether a series is of the context-of-interest class.
pub fn is_coi(s: &SeriesKey) -> bool {
    s.metric().starts_with("traffic.")
}

/// The value a point carries: a function of its event id, so a recompute knows it.
pub fn value_of(event: u64) -> f64 {
    (event % 1_000) as f64
}

/// What the client tasks share with the simulator.
#[derive(Debug)]
pub struct Clients {
    pub endpoint: quinn::Endpoint,
    pub identity: Identity,
    /// Address of every node, by index.
    pub nodes: Mutex<Vec<SocketAddr>>,
    /// Which nodes a client may pick (the simulator's health check).
    pub up: Mutex<Vec<bool>>,
    pub events: Mutex<Vec<Event>>,
    pub stop: AtomicBool,
    pub clock: HostClock,
}

impl Clients {
    fn record(&self, e: Event) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }

    fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    fn pick_node(&self, rng: &mut impl Rng, avoid: Option<usize>) -> Option<usize> {
        let up = self.up.lock().unwrap_or_else(|e| e.into_inner());
        let candidates: Vec<usize> = (0..up.len()).filter(|&i| up[i] && Some(i) != avoid).collect();
        if candidates.is_empty() {
            return (0..up.len()).find(|&i| up[i]);
        }
        Some(candidates[rng.random_range(0..candidates.len())])
    }

    fn options() -> ClientOptions {
        ClientOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(4),
            ..ClientOptions::default()
        }
    }

    async fn client(&self, cache: &mut HashMap<usize, Client>, node: usize) -> Result<Client, String> {
        if let Some(c) = cache.get(&node) {
            return Ok(c.clone());
        }
        let addr = self.nodes.lock().unwrap_or_else(|e| e.into_inner())[node];
        let c = Client::connect_on(self.endpoint.clone(), addr, &self.identity, Self::options())
            .await
            .map_err(|e| e.to_string())?;
        cache.insert(node, c.clone());
        Ok(c)
    }
}

/// A client's error as text, and the connection to `node` forgotten unless the node answered
/// (a refusal such as a short quorum leaves the connection as good as it was). Redialling after
/// every refusal made each fault that refuses writes a storm of handshakes no real client
/// would make.
fn forget_if_broken(cache: &mut HashMap<usize, Client>, node: usize, e: timeshard_sdk::Error) -> String {
    if e.code().is_none() {
        cache.remove(&node);
    }
    e.to_string()
}

/// A writer: a batch of 1 to 4 live points of one series every 50 to 300 ms, each sent to up
/// to three nodes in turn until one acknowledges it.
pub async fn writer(clients: Arc<Clients>, id: usize) {
    let series = series();
    let mut rng = rand::rngs::StdRng::seed_from_u64(timeshard_clock::rng().next_u64());
    let mut cache = HashMap::new();
    let mut seq = 0u64;
    while !clients.stop.load(Ordering::Relaxed) {
        let s = &series[rng.random_range(0..series.len())];
        let n = rng.random_range(1..=4);
        let base = timeshard_clock::now_ns();
        let points: Vec<Point> = (0..n)
            .map(|k| {
                seq += 1;
                let event = ((id as u64) << 40) | seq;
                Point { ts: base + k * 1_000, value: value_of(event), event }
            })
            .collect();
        let invoked = clients.now();
        let (mut attempts, mut acked, mut error) = (0, false, None);
        let mut last = None;
        while attempts < 3 && !acked {
            attempts += 1;
            let Some(node) = clients.pick_node(&mut rng, last) else { break };
            last = Some(node);
            let result = match clients.client(&mut cache, node).await {
                Ok(c) => c.write(s, &points).await.map_err(|e| forget_if_broken(&mut cache, node, e)),
                Err(e) => Err(e),
            };
            match result {
                Ok(_) => (acked, error) = (true, None),
                Err(e) => error = Some(e),
            }
        }
        let done = clients.now();
        let points: Vec<Pt> = points.iter().map(|p| (p.ts, p.event)).collect();
        clients.record(Event::Write {
            invoked,
            done,
            client: id,
            series: s.to_string(),
            points,
            attempts,
            acked,
            error,
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..300))).await;
    }
}

/// A reader: the newest point of a context-of-interest series, asked from inside its context
/// (the client declares an Atlanta location), through any node, every 100 to 400 ms.
pub async fn reader(clients: Arc<Clients>, id: usize) {
    let series: Vec<SeriesKey> = series().into_iter().filter(is_coi).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(timeshard_clock::rng().next_u64());
    let mut cache = HashMap::new();
    while !clients.stop.load(Ordering::Relaxed) {
        let s = &series[rng.random_range(0..series.len())];
        let Some(node) = clients.pick_node(&mut rng, None) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let invoked = clients.now();
        let result = match clients.client(&mut cache, node).await {
            Ok(c) => match c.with_location(CLIENT_LOCATION.0, CLIENT_LOCATION.1) {
                Ok(c) => c.latest(s).await.map_err(|e| forget_if_broken(&mut cache, node, e)),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e),
        };
        let done = clients.now();
        let (point, error) = match result {
            Ok(p) => (p.map(|p| (p.ts, p.event)), None),
            Err(e) => (None, Some(e)),
        };
        clients.record(Event::Latest { invoked, done, client: id, series: s.to_string(), via: node, point, error });
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
    }
}

/// After the faults: every point of every series, read through node `via` (page by page),
/// and its aggregates over 10 s windows.
pub async fn final_reads(clients: Arc<Clients>, via: Vec<usize>) {
    let mut cache = HashMap::new();
    let range = written_range();
    if via.is_empty() {
        return;
    }
    for (i, s) in series().iter().enumerate() {
        let node = via[i % via.len()];
        let t = clients.now();
        let read = async {
            let c = clients.client(&mut cache, node).await?;
            let mut points = Vec::new();
            let mut after = None;
            loop {
                let (page, next) = c.read_page(s, range, after).await.map_err(|e| e.to_string())?;
                points.extend(page.iter().map(|p| (p.ts, p.event)));
                match next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            let width = 10_000_000_000;
            let windows = c.aggregate(s, range, width).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((points, windows, width))
        }
        .await;
        match read {
            Ok((points, windows, width_ns)) => {
                clients.record(Event::FinalRead { t, series: s.to_string(), via: node, points, error: None });
                let windows = windows
                    .iter()
                    .map(|w| Window { start: w.start, count: w.count, sum: w.sum, min: w.min, max: w.max })
                    .collect();
                clients.record(Event::Aggregate {
                    t,
                    series: s.to_string(),
                    via: node,
                    width_ns,
                    windows,
                    error: None,
                });
            }
            Err(e) => {
                cache.remove(&node);
                clients.record(Event::FinalRead {
                    t,
                    series: s.to_string(),
                    via: node,
                    points: Vec::new(),
                    error: Some(e),
                })
            }
        }
    }
}
