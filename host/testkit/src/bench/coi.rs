//! `timeshard bench coi`: FogStore's evaluation on node processes on this machine, with the
//! WAN emulation between them.
//!
//! 8 nodes: 4 around Atlanta, plus Houston, San Francisco, Chicago and Seattle. Clients
//! (`clients` tasks, spread over the Atlanta nodes) read the `latest` point of series located
//! in the Atlanta bounding box or update them (a new point now), for every mode × read ratio ×
//! key distribution. The three modes are three classes of one cluster: `coi.` (n_in 2, n_out 1,
//! in-CoI quorum), `quorum.` (RF 3, W 2, R 2, DHT placement) and `eventual.` (RF 3, W 1, R 1).
//! A read is stale when it returns an older point than the last update acknowledged before the
//! read began. Then Atlanta is killed and the last acknowledged point of every `coi.` series is
//! read from Houston (`region_failure.readable_pct`). `load_balance` and `out_coi_km_p50` are
//! simulated over the sans-IO placement ([`super::coi_sim`]).
//!
//! Where the nodes' ids fall decides the DHT placement of `quorum.` and `eventual.`, and ids
//! come from keys: each cluster's keys derive from a seed (`--seeds`, a cluster each), so a
//! seed's figures repeat, and the document gives each seed's figures and their median and
//! range, so that one lucky placement cannot make the comparison.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};
use serde_json::json;
use timeshard_clock::now_ns;
use timeshard_node::config::{ClassConfig, CoiConfig, WanEmulation};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::stats::{Latencies, round3};

/// The topology, node by node: four nodes around Atlanta, then Houston, San Francisco,
/// Chicago and Seattle (the end-to-end test uses it too).
pub const LOCATIONS: [&str; 8] = [
    "33.749,-84.388",
    "33.775,-84.396",
    "33.700,-84.350",
    "33.850,-84.300",
    "29.760,-95.370",
    "37.775,-122.419",
    "41.878,-87.630",
    "47.606,-122.332",
];
/// The nodes of [`LOCATIONS`] around Atlanta, where the series live.
pub const ATLANTA: [usize; 4] = [0, 1, 2, 3];
/// The nearest node of [`LOCATIONS`] outside Atlanta's region.
pub const HOUSTON: usize = 4;
const MODES: [&str; 3] = ["coi", "quorum", "eventual"];
const READ_PCTS: [u32; 3] = [20, 50, 80];
const DISTRIBUTIONS: [&str; 3] = ["latest", "hotspot", "zipfian"];

/// What `bench coi` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct CoiOptions {
    /// Concurrent client tasks, colocated with the Atlanta nodes.
    pub clients: usize,
    /// Series per mode, located in the Atlanta bounding box.
    pub series: usize,
    /// Operations per run (mode × ratio × distribution).
    pub ops: usize,
    /// Series of the load-balance and out-of-CoI simulations.
    pub quick_simulation: bool,
    /// The seeds of the clusters' keys, one cluster each: node ids come from keys, and where
    /// they fall decides DHT placement (the `quorum.` and `eventual.` modes), so one seed's
    /// figures are one placement's.
    pub seeds: Vec<u64>,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for CoiOptions {
    fn default() -> Self {
        CoiOptions { clients: 16, series: 200, ops: 4_000, quick_simulation: false, seeds: vec![1, 2, 3], dir: None }
    }
}

impl CoiOptions {
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    pub fn quick() -> CoiOptions {
        CoiOptions { clients: 4, series: 8, ops: 24, quick_simulation: true, seeds: vec![1, 2], dir: None }
    }
}

/// The context of interest of the benchmark and the CoI tests: `n_in` replicas within 50 km
/// (a city region, in cells of 50 km), one far copy at least 1,000 km away.
pub fn city_coi(n_in: u8) -> CoiConfig {
    CoiConfig {
        n_in,
        n_out: 1,
        in_coi_dist: "50km".into(),
        out_coi_dist: "1000km".into(),
        coi_size: "50km".into(),
        precision: 5,
        location: None,
    }
}

fn classes() -> Vec<ClassConfig> {
    let quantum = Duration::from_secs(10);
    vec![
        ClassConfig {
            name: "coi".into(),
            metric_prefix: "coi.".into(),
            quantum,
            coi: Some(city_coi(2)),
            ..ClassConfig::default()
        },
        ClassConfig { name: "quorum".into(), metric_prefix: "quorum.".into(), quantum, ..ClassConfig::default() },
        ClassConfig {
            name: "eventual".into(),
            metric_prefix: "eventual.".into(),
            quantum,
            rf: 3,
            w: 1,
            r: 1,
            ..ClassConfig::default()
        },
    ]
}

/// Series `i` of `mode`, at a point of the Atlanta bounding box.
fn series_of(mode: &str, i: usize) -> SeriesKey {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
    let (lat, lon) = (rng.random_range(33.60..33.95), rng.random_range(-84.55..-84.20));
    format!("{mode}.traffic{{lat={lat:.5},lon={lon:.5},seg={i}}}").parse().expect("valid series key")
}

/// Picks series indices by FogStore's key distributions.
struct Keys {
    n: usize,
    zipf_cdf: Vec<f64>,
}

impl Keys {
    fn new(n: usize) -> Keys {
        let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(0.99)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let zipf_cdf = weights.iter().map(|w| {
            acc += w / total;
            acc
        });
        Keys { n, zipf_cdf: zipf_cdf.collect() }
    }

    /// `latest`: the most recently updated series are the likeliest (`newest` is the last
    /// updated); `hotspot`: 80 % of the operations on 20 % of the series; `zipfian`: Zipf 0.99.
    fn pick(&self, dist: &str, newest: usize, rng: &mut impl Rng) -> usize {
        match dist {
            "latest" => {
                let back = self.zipf(rng);
                (newest + self.n - back % self.n) % self.n
            }
            "hotspot" => {
                let hot = (self.n / 5).max(1);
                if rng.random_bool(0.8) { rng.random_range(0..hot) } else { rng.random_range(0..self.n) }
            }
            _ => self.zipf(rng),
        }
    }

    fn zipf(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        self.zipf_cdf.partition_point(|&c| c < u).min(self.n - 1)
    }
}

/// The last acknowledged update of each series, shared by the clients.
#[derive(Default)]
struct Acked {
    last: Mutex<HashMap<usize, i64>>,
    newest: Mutex<usize>,
}

struct RunResult {
    reads: Latencies,
    updates: Latencies,
    stale: u64,
    elapsed: Duration,
}

async fn run_one(
    clients: &[Arc<Client>],
    mode: &str,
    read_pct: u32,
    dist: &str,
    args: &CoiOptions,
) -> Result<RunResult> {
    let keys = Arc::new(Keys::new(args.series));
    let acked = Arc::new(Acked::default());
    let per_client = args.ops.div_ceil(clients.len());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let (client, keys, acked, mode, dist) =
            (client.clone(), keys.clone(), acked.clone(), mode.to_string(), dist.to_string());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c as u64 * 7919 + u64::from(read_pct));
            let (mut reads, mut updates, mut stale) = (Latencies::default(), Latencies::default(), 0u64);
            for _ in 0..per_client {
                let newest = *acked.newest.lock().expect("lock");
                let i = keys.pick(&dist, newest, &mut rng);
                let series = series_of(&mode, i);
                let t = Instant::now();
                if rng.random_range(0..100) < read_pct {
                    let before = acked.last.lock().expect("lock").get(&i).copied();
                    let got = client.latest(&series).await?;
                    reads.push(t.elapsed());
                    if let Some(b) = before
                        && got.is_none_or(|p| p.ts < b)
                    {
                        stale += 1;
                    }
                } else {
                    let ts = now_ns();
                    client.write(&series, &[Point::new(ts, ts as f64)]).await?;
                    updates.push(t.elapsed());
                    let mut last = acked.last.lock().expect("lock");
                    let e = last.entry(i).or_insert(ts);
                    *e = (*e).max(ts);
                    *acked.newest.lock().expect("lock") = i;
                }
            }
            anyhow::Ok((reads, updates, stale))
        }));
    }
    let (mut reads, mut updates, mut stale) = (Latencies::default(), Latencies::default(), 0);
    for t in tasks {
        let (r, u, s) = t.await??;
        reads.extend(&r);
        updates.extend(&u);
        stale += s;
    }
    Ok(RunResult { reads, updates, stale, elapsed: start.elapsed() })
}

/// Runs the benchmark on node processes of `binary`, a cluster per seed, and returns its JSON
/// document: each seed's figures under `seeds`, and across them, each run's medians (`runs`)
/// and each mode's median and range of its runs' p99s (`modes`).
pub async fn run(binary: &Path, args: &CoiOptions) -> Result<serde_json::Value> {
    if args.clients == 0 || args.series == 0 || args.ops == 0 || args.seeds.is_empty() {
        bail!("clients, series, ops and seeds must be positive");
    }
    let dir = WorkDir::new("coi", args.dir.as_deref());
    let mut seeds = Vec::new();
    for &seed in &args.seeds {
        println!("seed {seed}");
        seeds.push(measure(binary, &dir.path().join(format!("seed-{seed}")), args, seed).await?);
    }
    let sim = super::coi_sim::simulate(7, args.quick_simulation);
    println!(
        "out-of-CoI replica distance p50: {} km (by out_coi_dist: {})",
        sim["out_coi_km_p50"], sim["out_coi_km_p50_by_out_coi_dist"]
    );
    let readable: Vec<f64> = seeds.iter().filter_map(|d| d["region_failure"]["readable_pct"].as_f64()).collect();
    let doc = json!({
        "nodes": LOCATIONS.len(),
        "clients": args.clients,
        "series": args.series,
        "ops_per_run": args.ops,
        "wan_emulation": {"per_hop_ms": 0.2, "route_factor": 1.5},
        "runs": across_seeds(&seeds),
        "modes": modes(&seeds),
        "region_failure": {
            "readable_pct": readable.iter().copied().fold(f64::INFINITY, f64::min),
            "readable_pct_by_seed": readable,
            "series": seeds[0]["region_failure"]["series"],
        },
        "load_balance": sim["load_balance"],
        "out_coi_km_p50": sim["out_coi_km_p50"],
        "out_coi_km_p50_by_out_coi_dist": sim["out_coi_km_p50_by_out_coi_dist"],
        "floor": seeds[0]["floor"],
        "seeds": seeds,
    });
    println!("{}", doc["modes"]);
    Ok(doc)
}

/// The figures of a run's row that are latencies, rates or shares.
const FIGURES: [&str; 8] = [
    "read_p50_ms",
    "read_p95_ms",
    "read_p99_ms",
    "update_p50_ms",
    "update_p95_ms",
    "update_p99_ms",
    "ops_per_s",
    "stale_read_pct",
];

fn figures(doc: &serde_json::Value, run: usize, key: &str) -> Vec<f64> {
    doc["runs"].get(run).and_then(|r| r[key].as_f64()).into_iter().collect()
}

/// Each run (mode x read ratio x distribution) with the median over the seeds of each figure,
/// and the range of its p99s.
fn across_seeds(seeds: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let runs = seeds[0]["runs"].as_array().map_or(0, Vec::len);
    (0..runs)
        .map(|i| {
            let first = &seeds[0]["runs"][i];
            let mut row = json!({
                "mode": first["mode"],
                "read_pct": first["read_pct"],
                "distribution": first["distribution"],
            });
            for key in FIGURES {
                let v: Vec<f64> = seeds.iter().flat_map(|d| figures(d, i, key)).collect();
                row[key] = json!(round3(crate::stats::median(&v)));
                if key.ends_with("p99_ms") {
                    row[format!("{key}_range")] = json!(range(&v));
                }
            }
            row
        })
        .collect()
}

/// Per mode: the median of its runs' read and update p99 over every seed, the range of each
/// seed's median, and the most stale reads of any run.
fn modes(seeds: &[serde_json::Value]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for mode in MODES {
        let of = |doc: &serde_json::Value, key: &str| -> Vec<f64> {
            let runs = doc["runs"].as_array().into_iter().flatten();
            runs.filter(|r| r["mode"] == mode).filter_map(|r| r[key].as_f64()).collect()
        };
        let mut m = serde_json::Map::new();
        for key in ["read_p99_ms", "update_p99_ms"] {
            let all: Vec<f64> = seeds.iter().flat_map(|d| of(d, key)).collect();
            let per_seed: Vec<f64> = seeds.iter().map(|d| crate::stats::median(&of(d, key))).collect();
            m.insert(key.into(), json!({"median": round3(crate::stats::median(&all)), "seed_medians": per_seed.iter().map(|v| round3(*v)).collect::<Vec<_>>(), "range": range(&per_seed)}));
        }
        let stale = seeds.iter().flat_map(|d| of(d, "stale_read_pct")).fold(0.0, f64::max);
        m.insert("stale_read_pct_max".into(), json!(round3(stale)));
        out.insert(mode.into(), m.into());
    }
    out.into()
}

/// `[min, max]` of `v`, rounded.
fn range(v: &[f64]) -> [f64; 2] {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    [round3(min), round3(max)]
}

/// One seed's cluster and its 27 runs, then the region failure.
async fn measure(binary: &Path, dir: &Path, args: &CoiOptions, seed: u64) -> Result<serde_json::Value> {
    let mut options = ClusterOptions::new(LOCATIONS.len(), dir, binary);
    options.pki_seed = Some(seed);
    options.classes = classes();
    options.locations = LOCATIONS.iter().map(|l| Some(l.to_string())).collect();
    options.wan_emulation = Some(WanEmulation { per_hop_ms: 0.2, route_factor: 1.5 });
    options.membership.gossip_interval = Duration::from_millis(200);
    options.membership.suspect_after = Duration::from_secs(3);
    options.dht.request_timeout = Duration::from_secs(2);
    options.dht.connect_timeout = Duration::from_secs(1);
    let mut cluster = LocalCluster::start_converged(options).await?;
    // In-CoI reads need every in-CoI owner settled: a fresh node is not until its first
    // catch-up round.
    cluster.wait_settled(Duration::from_secs(60)).await?;
    let mut clients = Vec::new();
    for c in 0..args.clients {
        clients.push(Arc::new(cluster.client(ATLANTA[c % ATLANTA.len()]).await?));
    }
    let floor = Floor::measure(cluster.dir(), &clients[0]).await?;
    println!("{}", floor.summary());

    // Every series gets a first point, so reads of `latest` find one.
    for mode in MODES {
        for i in 0..args.series {
            let ts = now_ns();
            clients[i % clients.len()].write(&series_of(mode, i), &[Point::new(ts, ts as f64)]).await?;
        }
    }

    let mut runs = Vec::new();
    for mode in MODES {
        for read_pct in READ_PCTS {
            for dist in DISTRIBUTIONS {
                let r = run_one(&clients, mode, read_pct, dist, args).await?;
                let ops = r.reads.len() + r.updates.len();
                let row = json!({
                    "mode": mode,
                    "read_pct": read_pct,
                    "distribution": dist,
                    "read_p50_ms": round3(r.reads.percentile_ms(50.0)),
                    "read_p95_ms": round3(r.reads.percentile_ms(95.0)),
                    "read_p99_ms": round3(r.reads.percentile_ms(99.0)),
                    "update_p50_ms": round3(r.updates.percentile_ms(50.0)),
                    "update_p95_ms": round3(r.updates.percentile_ms(95.0)),
                    "update_p99_ms": round3(r.updates.percentile_ms(99.0)),
                    "ops_per_s": round3(ops as f64 / r.elapsed.as_secs_f64().max(1e-9)),
                    "stale_read_pct": round3(100.0 * r.stale as f64 / r.reads.len().max(1) as f64),
                });
                println!("{row}");
                runs.push(row);
            }
        }
    }

    // Region failure: the last point of every coi series, read from Houston with Atlanta down.
    let mut last: Vec<(SeriesKey, Point)> = Vec::new();
    for i in 0..args.series {
        let series = series_of("coi", i);
        if let Some(p) = clients[0].latest(&series).await? {
            last.push((series, p));
        }
    }
    for c in clients {
        if let Ok(c) = Arc::try_unwrap(c) {
            c.close().await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in ATLANTA {
        cluster.kill(i).await?;
    }
    let far = cluster.client(HOUSTON).await?;
    let mut readable = 0usize;
    for (series, p) in &last {
        let range = TimeRange::new(p.ts, p.ts + 1)?;
        if far.read(series, range).await.is_ok_and(|got| got.contains(p)) {
            readable += 1;
        }
    }
    far.close().await;
    let readable_pct = round3(100.0 * readable as f64 / last.len().max(1) as f64);
    println!("region failure: {readable} of {} last points readable with Atlanta down", last.len());
    let ids: Vec<String> = (0..LOCATIONS.len()).map(|i| cluster.id(i).short()).collect();
    cluster.shutdown().await?;
    Ok(json!({
        "seed": seed,
        "node_ids": ids,
        "runs": runs,
        "region_failure": {"readable_pct": readable_pct, "series": last.len()},
        "floor": floor,
    }))
}
