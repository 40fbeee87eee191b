//! What a test writer had acknowledged, and the checks of the repair tests and benchmark: that
//! every acknowledged point reads back, one by one ([`Ledger::missing_through`]), and where
//! the cluster's blocks live compared with their owners ([`placement`]).
//!
//! [`LiveWriter`] ingests live timestamps (near now) in the background through one node, the
//! way the repair tests keep a cluster busy while its membership changes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use timeshard_proto::placement::{owners, placement_id};
use timeshard_proto::{Classes, Contact, Id, Point, PointKey, Quantum, SeriesKey, TimeRange};
use timeshard_sdk::{Client, SeriesPoints};
use tokio::task::JoinHandle;

use crate::cluster::LocalCluster;
use crate::inspect::Inspector;

/// Acknowledged points per series.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    acked: BTreeMap<SeriesKey, Vec<Point>>,
}

/// What reading a ledger back found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadBack {
    /// Acknowledged points looked for, and those not found.
    pub checked: usize,
    pub missing: usize,
    /// The first few missing, for the failure message.
    pub examples: Vec<String>,
}

impl Ledger {
    /// Records that `points` of `series` were acknowledged.
    pub fn ack(&mut self, series: &SeriesKey, points: &[Point]) {
        self.acked.entry(series.clone()).or_default().extend_from_slice(points);
    }

    /// Adds everything `other` acknowledged.
    pub fn merge(&mut self, other: Ledger) {
        for (s, p) in other.acked {
            self.acked.entry(s).or_default().extend(p);
        }
    }

    /// Acknowledged points.
    pub fn points(&self) -> usize {
        self.acked.values().map(Vec::len).sum()
    }

    /// The acknowledged points, by series.
    pub fn acked(&self) -> &BTreeMap<SeriesKey, Vec<Point>> {
        &self.acked
    }

    /// Reads every series written through `client` over the span of its acknowledged points
    /// and looks for each acknowledged point.
    pub async fn missing_through(&self, client: &Client) -> Result<ReadBack> {
        let mut out = ReadBack::default();
        for (series, points) in &self.acked {
            let (first, last) = points.iter().fold((i64::MAX, i64::MIN), |(a, b), p| (a.min(p.ts), b.max(p.ts)));
            if first > last {
                continue;
            }
            let have: HashSet<PointKey> =
                client.read(series, TimeRange::new(first, last + 1)?).await?.iter().map(Point::key).collect();
            for p in points {
                out.checked += 1;
                if !have.contains(&p.key()) {
                    out.missing += 1;
                    if out.examples.len() < 5 {
                        out.examples.push(format!("{series} at {}", p.ts));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Where the blocks of a cluster live, against their owners among the running nodes.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Distinct (series, quantum) blocks held anywhere.
    pub blocks: usize,
    /// Copies held by nodes that do not own the block.
    pub displaced: Vec<String>,
    /// Owners that do not hold a block some node holds.
    pub lacking: Vec<String>,
    /// Blocks whose holders report different digests.
    pub differing: Vec<String>,
    /// Points held, every copy counted.
    pub point_copies: u64,
}

impl Placement {
    /// Whether every block is on exactly its owners, with equal digests.
    pub fn is_exact(&self) -> bool {
        self.displaced.is_empty() && self.lacking.is_empty() && self.differing.is_empty()
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        format!(
            "{} blocks: {} copies on non-owners, {} owners lacking, {} differing (first: {:?})",
            self.blocks,
            self.displaced.len(),
            self.lacking.len(),
            self.differing.len(),
            self.displaced.iter().chain(&self.lacking).chain(&self.differing).take(3).collect::<Vec<_>>()
        )
    }
}

/// Lists the blocks of every running node of `cluster` and compares their holders with their
/// `rf` owners among the running nodes, placed by `classes`.
pub async fn placement(cluster: &LocalCluster, classes: &Classes) -> Result<Placement> {
    let running: Vec<usize> = (0..cluster.len()).filter(|&i| cluster.is_running(i)).collect();
    let members: Vec<Contact> = running.iter().map(|&i| cluster.contacts()[i]).collect();
    let mut inspector = Inspector::new(cluster).await?;
    let mut holders: BTreeMap<(SeriesKey, Quantum), Vec<(Id, u64)>> = BTreeMap::new();
    let mut out = Placement::default();
    for c in &members {
        for b in inspector.blocks(c.addr).await? {
            out.point_copies += b.count;
            holders.entry((b.series, b.quantum)).or_default().push((c.id, b.digest));
        }
    }
    inspector.close().await;
    out.blocks = holders.len();
    let short: HashMap<Id, String> = running.iter().map(|&i| (cluster.id(i), format!("node {i}"))).collect();
    for ((series, q), held) in holders {
        let rf = usize::from(classes.of(&series).replication.rf);
        let owning: HashSet<Id> =
            owners(&members, &placement_id(&series, &q, classes), rf).iter().map(|c| c.id).collect();
        let what = format!("{series} at {}", q.start);
        for (id, _) in held.iter().filter(|(id, _)| !owning.contains(id)) {
            out.displaced.push(format!("{what} on {}", short[id]));
        }
        let have: HashSet<Id> = held.iter().map(|(id, _)| *id).collect();
        for id in owning.iter().filter(|id| !have.contains(id)) {
            out.lacking.push(format!("{what} not on {}", short[id]));
        }
        if held.iter().any(|(_, d)| *d != held[0].1) {
            out.differing.push(what);
        }
    }
    Ok(out)
}

/// A background writer of live timestamps through one node: `series` series of `metric`, a
/// batch of 40 points each (250 µs apart) every 20 ms.
#[derive(Debug)]
pub struct LiveWriter {
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<(u64, u64)>,
}

impl LiveWriter {
    /// Starts writing through `client`.
    pub fn start(client: Client, metric: &str, series: u32) -> LiveWriter {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let keys: Vec<SeriesKey> =
            (0..series).map(|i| format!("{metric}{{feeder={i}}}").parse().expect("valid series key")).collect();
        let (l, s) = (ledger.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let (mut ok, mut failed) = (0, 0);
            let mut last = 0;
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let base = timeshard_clock::now_ns().max(last + 1);
                last = base + 39 * 250_000;
                let batch: Vec<SeriesPoints> = keys
                    .iter()
                    .map(|k| SeriesPoints {
                        series: k.clone(),
                        points: (0..40).map(|j| Point::new(base + j * 250_000, (n * 100 + j as u64) as f64)).collect(),
                    })
                    .collect();
                n += 1;
                match client.write_batch(batch.clone()).await {
                    Ok(_) => {
                        ok += 1;
                        let mut l = l.lock().expect("ledger lock");
                        for b in &batch {
                            l.ack(&b.series, &b.points);
                        }
                    }
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            client.close().await;
            (ok, failed)
        });
        LiveWriter { ledger, stop, task }
    }

    /// What was acknowledged so far.
    pub fn snapshot(&self) -> Ledger {
        self.ledger.lock().expect("ledger lock").clone()
    }

    /// Stops writing; returns what was acknowledged, and the batches acknowledged and failed.
    pub async fn stop(self) -> Result<(Ledger, u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let (ok, failed) = self.task.await?;
        let ledger = std::mem::take(&mut *self.ledger.lock().expect("ledger lock"));
        Ok((ledger, ok, failed))
    }
}
