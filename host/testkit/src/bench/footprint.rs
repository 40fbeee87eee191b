//! `timeshard bench footprint`: what a node costs the device it runs on (issue 14, "Edge
//! footprint" in DESIGN.md), on node processes of the binary under test.
//!
//! - `idle_rss_mb` / `vsz_mb`: one node with the default configuration (disk store, no
//!   policies), idle for `idle_secs` after it started: its resident set and virtual size
//!   (`/proc/<pid>/status`);
//! - `idle_rss_mb_with_policies` (and `vsz_mb_with_policies`): the same with one ingest policy
//!   (`pmu-validate`) and one query policy (`rms`) loaded;
//! - `rss_mb_at_10k_points_per_s`: 3 nodes, RF 3, W 2, a client writing `pmu` data (60 Hz
//!   series, one batch every 100 ms, timestamps of now) at `rate` points/s for `secs`: the
//!   largest resident set of the three at the end;
//! - `cpu_pct_per_1k_points_per_s`: the nodes' CPU time over that run (user + system, from
//!   `/proc/<pid>/stat`), as % of one core per node, per 1,000 points/s the cluster took;
//! - `binary_mb`: the `timeshard` binary per target, as built (release) and stripped, from
//!   `scripts/cross-check`'s `sizes.json` when it is there, else the host binary only;
//! - `policy_ns_per_point_pulley` / `_cranelift`: `pmu-validate` over 1,000-point batches in this
//!   process, on the Pulley interpreter (what armv7 runs) and as Cranelift native code.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_node::config::ClassConfig;
use timeshard_policy::signing::{self, Identity, TrustedKeys};
use timeshard_policy::{Backend, Binding, Bindings, Kind, Limits, Module, PolicyRef, Registry, Settings};
use timeshard_proto::Point;
use timeshard_sdk::SeriesPoints;

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::datasets::{T0, pmu_point, pmu_series};
use crate::procfs;
use crate::stats::{median, round3};

/// What `bench footprint` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct FootprintOptions {
    /// Points per second written into the 3-node cluster.
    pub rate: u64,
    /// Seconds of that ingest.
    pub secs: u64,
    /// Seconds an idle node runs before it is measured.
    pub idle_secs: u64,
    /// Batches of 1,000 points per policy figure (the median of 5 passes is reported).
    pub policy_batches: usize,
    /// The guest workspace, built by guest/build.sh.
    pub guest_dir: PathBuf,
    /// Where `scripts/cross-check` wrote `sizes.json` (default: `cross-check/` in the target
    /// directory the binary was built in).
    pub sizes: Option<PathBuf>,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for FootprintOptions {
    fn default() -> Self {
        FootprintOptions {
            rate: 10_000,
            secs: 300,
            idle_secs: 10,
            policy_batches: 100,
            guest_dir: PathBuf::from("guest"),
            sizes: None,
            dir: None,
        }
    }
}

impl FootprintOptions {
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    pub fn quick() -> FootprintOptions {
        FootprintOptions { rate: 2_000, secs: 3, idle_secs: 1, policy_batches: 5, ..FootprintOptions::default() }
    }
}

fn mb(bytes: u64) -> f64 {
    round3(bytes as f64 / (1u64 << 20) as f64)
}

fn pid(cluster: &LocalCluster, i: usize) -> Result<u32> {
    cluster.pid(i).context("node process has no pid")
}

/// The `policy` section that loads `pmu-validate` (ingest) and `rms` (query), signed with a
/// fresh key, for every `pmu.` series.
fn policy_section(guest_dir: &Path, dir: &Path) -> Result<timeshard_policy::Config> {
    std::fs::create_dir_all(dir)?;
    let key = signing::generate_keypair()?;
    let mut modules = Vec::new();
    for (guest, kind) in [("pmu-validate", Kind::Ingest), ("rms", Kind::Query)] {
        let path = dir.join(format!("{}.wasm", guest.replace('-', "_")));
        std::fs::copy(timeshard_policy::guest_artifact(guest_dir, guest)?, &path)?;
        let bytes = std::fs::read(&path)?;
        let identity = Identity::new(PolicyRef::new(guest, "1.0.0")?, kind);
        let signature = dir.join(format!("{}.wasm.sig", guest.replace('-', "_")));
        std::fs::write(&signature, signing::sign(&key, &bytes, &identity).to_text())?;
        modules.push(timeshard_policy::ModuleConfig {
            name: guest.into(),
            version: "1.0.0".into(),
            kind,
            wasm: path,
            signature: Some(signature),
            settings: Settings::default(),
        });
    }
    Ok(timeshard_policy::Config {
        trusted_keys: vec![key.public().to_text()],
        modules,
        bindings: Bindings(vec![Binding {
            ingest: Some("pmu-validate".parse()?),
            query: vec!["rms".parse()?],
            ..Binding::default()
        }]),
        ..timeshard_policy::Config::default()
    })
}

/// One node with `policy`, idle for `idle_secs`: (rss, vsz) in bytes, and the floor if asked.
async fn idle_node(
    binary: &Path,
    dir: &Path,
    policy: timeshard_policy::Config,
    o: &FootprintOptions,
    floor: bool,
) -> Result<(u64, u64, Option<Floor>)> {
    let mut options = ClusterOptions::new(1, dir, binary);
    options.classes = vec![ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.policy = policy;
    options.log = "warn".into();
    let node = LocalCluster::start_converged(options).await?;
    tokio::time::sleep(Duration::from_secs(o.idle_secs)).await;
    let procfs::Memory { rss, virt: vsz, .. } = procfs::memory(pid(&node, 0)?)?;
    let floor = if floor {
        let client = node.client(0).await?;
        let f = Floor::measure(node.dir(), &client).await?;
        client.close().await;
        Some(f)
    } else {
        None
    };
    node.shutdown().await?;
    Ok((rss, vsz, floor))
}

/// What the 3-node ingest run measured.
struct Ingest {
    rate: f64,
    rss: Vec<u64>,
    cpu_pct: Vec<f64>,
}

/// Writes `o.rate` points/s of `pmu` data for `o.secs` into 3 nodes (RF 3, W 2).
async fn ingest(binary: &Path, dir: &Path, o: &FootprintOptions) -> Result<Ingest> {
    let mut options = ClusterOptions::new(3, dir, binary);
    options.classes = vec![ClassConfig { name: "bench".into(), rf: 3, w: 2, r: 2, ..Default::default() }];
    options.log = "warn".into();
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;
    // 60 Hz series, 6 samples each per 100 ms tick.
    let series = (o.rate / 60).max(1) as u32;
    let keys: Vec<_> = (0..series).map(pmu_series).collect();
    let now = timeshard_clock::now_ns();
    let pids: Vec<u32> = (0..3).map(|i| pid(&cluster, i)).collect::<Result<_>>()?;
    let cpu0: Vec<Duration> = pids.iter().map(|&p| procfs::cpu_time(p)).collect::<Result<_>>()?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut written, mut i) = (0u64, 0u64);
    while started.elapsed() < Duration::from_secs(o.secs) {
        tick.tick().await;
        let batch: Vec<SeriesPoints> = keys
            .iter()
            .enumerate()
            .map(|(bus, k)| SeriesPoints {
                series: k.clone(),
                points: (i..i + 6)
                    .map(|j| {
                        let p = pmu_point(bus as u32, j);
                        Point { ts: now + (p.ts - T0), ..p }
                    })
                    .collect(),
            })
            .collect();
        written += client.write_batch(batch).await.context("writing at the benchmark's rate")?.points;
        i += 6;
    }
    let elapsed = started.elapsed();
    let mut rss = Vec::new();
    let mut cpu_pct = Vec::new();
    for (p, c0) in pids.iter().zip(&cpu0) {
        rss.push(procfs::memory(*p)?.rss);
        cpu_pct.push(100.0 * (procfs::cpu_time(*p)? - *c0).as_secs_f64() / elapsed.as_secs_f64());
    }
    client.close().await;
    cluster.shutdown().await?;
    Ok(Ingest { rate: written as f64 / elapsed.as_secs_f64(), rss, cpu_pct })
}

/// Median ns per point of `pmu-validate` over 1,000-point batches with `backend`.
fn policy_ns_per_point(guest_dir: &Path, backend: Backend, batches: usize) -> Result<f64> {
    let key = signing::generate_keypair()?;
    let limits = Limits { backend, deadline: Duration::from_secs(10), ..Limits::default() };
    let registry = Registry::new(limits, TrustedKeys::new([key.public()]))?;
    let bytes = std::fs::read(timeshard_policy::guest_artifact(guest_dir, "pmu-validate")?)?;
    let policy = PolicyRef::new("pmu-validate", "1.0.0")?;
    let signature = signing::sign(&key, &bytes, &Identity::new(policy.clone(), Kind::Ingest)).to_text();
    registry.install(Module {
        policy,
        kind: Kind::Ingest,
        wasm: bytes,
        signature: Some(signature),
        settings: Settings::default(),
    })?;
    registry.bind(Bindings(vec![Binding { ingest: Some("pmu-validate".parse()?), ..Binding::default() }]))?;
    let series = pmu_series(0);
    let data: Vec<Vec<Point>> =
        (0..batches as u64).map(|b| (0..1_000).map(|j| pmu_point(0, b * 1_000 + j)).collect()).collect();
    registry.ingest(&series, data[0].clone())?;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for b in &data {
            std::hint::black_box(registry.ingest(&series, b.clone())?);
        }
        samples.push(t.elapsed().as_nanos() as f64 / (batches * 1_000) as f64);
    }
    Ok(round3(median(&samples)))
}

/// `binary_mb` (and stripped) per target: from `sizes.json` of `scripts/cross-check` if there,
/// else the host binary.
fn binary_sizes(binary: &Path, sizes: &Path) -> Result<(serde_json::Value, serde_json::Value, &'static str)> {
    if let Ok(text) = std::fs::read_to_string(sizes) {
        let doc: serde_json::Value = serde_json::from_str(&text).context("reading sizes.json")?;
        let mut built = serde_json::Map::new();
        let mut stripped = serde_json::Map::new();
        for (target, v) in doc.as_object().context("sizes.json is not an object")? {
            built.insert(target.clone(), json!(mb(v["bytes"].as_u64().unwrap_or(0))));
            stripped.insert(target.clone(), json!(mb(v["stripped_bytes"].as_u64().unwrap_or(0))));
        }
        return Ok((built.into(), stripped.into(), "scripts/cross-check"));
    }
    let host = format!("{}-unknown-{}", std::env::consts::ARCH, std::env::consts::OS);
    let bytes = std::fs::metadata(binary)?.len();
    Ok((json!({ host: mb(bytes) }), json!({}), "the benchmark's own binary"))
}

/// Runs the benchmark with node processes of `binary` and returns its JSON document.
pub async fn run(binary: &Path, o: &FootprintOptions) -> Result<serde_json::Value> {
    if o.secs == 0 || o.rate == 0 {
        bail!("secs and rate must be positive");
    }
    let dir = WorkDir::new("footprint", o.dir.as_deref());
    measure(binary, dir.path(), o).await
}

async fn measure(binary: &Path, dir: &Path, o: &FootprintOptions) -> Result<serde_json::Value> {
    eprintln!("idle node, default configuration, in {}", dir.display());
    let (idle_rss, vsz, floor) = idle_node(binary, &dir.join("idle"), Default::default(), o, true).await?;
    let floor = floor.context("no floor")?;
    println!("{}", floor.summary());
    println!("idle node: {:.1} MB resident, {:.0} MB virtual", mb(idle_rss), mb(vsz));
    let policy = policy_section(&o.guest_dir, &dir.join("policies"))?;
    let (policy_rss, policy_vsz, _) = idle_node(binary, &dir.join("idle-policies"), policy, o, false).await?;
    println!("idle node with 2 policies: {:.1} MB resident, {:.0} MB virtual", mb(policy_rss), mb(policy_vsz));

    eprintln!("3 nodes, RF 3, {} points/s for {} s", o.rate, o.secs);
    let run = ingest(binary, &dir.join("ingest"), o).await?;
    let rss_max = run.rss.iter().copied().max().unwrap_or(0);
    let cpu_mean = run.cpu_pct.iter().sum::<f64>() / run.cpu_pct.len().max(1) as f64;
    let cpu_per_1k = cpu_mean / (run.rate / 1_000.0).max(f64::MIN_POSITIVE);
    println!(
        "3 nodes at {:.0} points/s: {:.1} MB resident (largest), {:.2} % of a core per node per 1k points/s",
        run.rate,
        mb(rss_max),
        cpu_per_1k
    );

    let guest_dir = o.guest_dir.clone();
    let batches = o.policy_batches.max(1);
    let (pulley, cranelift) = tokio::task::spawn_blocking(move || -> Result<(f64, f64)> {
        Ok((
            policy_ns_per_point(&guest_dir, Backend::Pulley, batches)?,
            policy_ns_per_point(&guest_dir, Backend::Native, batches)?,
        ))
    })
    .await??;
    println!("pmu-validate: {pulley:.1} ns/point on Pulley, {cranelift:.1} ns/point as Cranelift code");

    let sizes = match &o.sizes {
        Some(s) => s.clone(),
        None => binary.parent().and_then(Path::parent).unwrap_or(Path::new(".")).join("cross-check/sizes.json"),
    };
    let (binary_mb, binary_mb_stripped, sizes_from) = binary_sizes(binary, &sizes)?;
    println!("binary: {binary_mb} MB as built, {binary_mb_stripped} MB stripped ({sizes_from})");

    Ok(json!({
        "idle_rss_mb": mb(idle_rss),
        "idle_rss_mb_with_policies": mb(policy_rss),
        "rss_mb_at_10k_points_per_s": mb(rss_max),
        "cpu_pct_per_1k_points_per_s": round3(cpu_per_1k),
        "binary_mb": binary_mb,
        "policy_ns_per_point_pulley": pulley,
        "policy_ns_per_point_cranelift": cranelift,
        "vsz_mb": mb(vsz),
        "floor": floor,
        "vsz_mb_with_policies": mb(policy_vsz),
        "binary_mb_stripped": binary_mb_stripped,
        "binary_sizes_from": sizes_from,
        "ingest": {
            "points_per_s": run.rate.round(),
            "rss_mb": run.rss.iter().map(|&b| mb(b)).collect::<Vec<_>>(),
            "cpu_pct": run.cpu_pct.iter().map(|&c| round3(c)).collect::<Vec<_>>(),
        },
        "settings": {"rate": o.rate, "secs": o.secs, "idle_secs": o.idle_secs, "nodes": 3, "rf": 3, "w": 2,
            "policy_batch_points": 1_000, "policy_batches": batches, "store": "disk, durable"},
    }))
}
