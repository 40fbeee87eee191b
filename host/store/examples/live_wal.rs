//! Measures the log and the restart on live data: ingests wall-clock timestamps into data series
//! with 10 s quanta and their quantum-index series (366-day quanta, one point per series and
//! span of 64 quanta, as a node writes them) as fast as it can, with maintenance every second
//! on the wall clock; prints the log size as it goes; then reopens the directory in a fresh
//! process, as after a SIGKILL (the store needs no shutdown step), and prints how long opening
//! took, what it replayed and the process's RSS.
//!
//! `cargo run -p timeshard-store --example live_wal -- [--seconds N] [--rate P] [--series N] [--old] [DIR]`
//! `--rate` is the target in points per second (default 180,000, the rate the issue measured);
//! `--old` turns checkpoints off (no age or log-size bound), as before they existed.
//! DIR defaults to a temporary directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use timeshard_clock::now_ns;
use timeshard_proto::point::BlockPoints;
use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey};
use timeshard_store::{DiskConfig, DiskStore, Store};

const REOPEN: &str = "--reopen";

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn config(old: bool) -> DiskConfig {
    if old {
        DiskConfig { max_open_age_ns: i64::MAX, max_wal_bytes: u64::MAX, ..DiskConfig::default() }
    } else {
        DiskConfig::default()
    }
}

fn reopen(dir: &Path, old: bool) -> anyhow::Result<()> {
    let before = rss_mb();
    let start = Instant::now();
    let store = DiskStore::open(dir, config(old))?;
    let took = start.elapsed();
    let st = store.stats();
    println!(
        "restart: opened in {:.2} s, replayed {:.1} MB of log in {} segments into {} open points; RSS {:.0} MB \
         (before opening {:.0} MB)",
        took.as_secs_f64(),
        st.wal_bytes as f64 / 1e6,
        st.wal_segments,
        st.open_points,
        rss_mb(),
        before
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut seconds, mut n_series, mut old, mut dir, mut reopen_only) = (60u64, 1_000usize, false, None, false);
    let mut rate = 180_000u64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().unwrap_or_default().parse()?,
            "--series" => n_series = args.next().unwrap_or_default().parse()?,
            "--rate" => rate = args.next().unwrap_or_default().parse()?,
            "--old" => old = true,
            REOPEN => reopen_only = true,
            other => dir = Some(PathBuf::from(other)),
        }
    }
    if reopen_only {
        return reopen(&dir.expect("a directory to reopen"), old);
    }
    let tmp = tempfile::tempdir()?;
    let dir = dir.unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let data_len = QuantumLen::new(10_000_000_000)?;
    let index_len = timeshard_proto::key::index_quantum();
    let series: Vec<SeriesKey> =
        (0..n_series).map(|i| format!("live.m{{dev={i}}}").parse()).collect::<Result<_, _>>()?;
    let index: Vec<SeriesKey> = series.iter().map(timeshard_proto::key::quantum_index_series).collect();
    {
        let store = DiskStore::open(&dir, config(old))?;
        let points = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let start = Instant::now();
        std::thread::scope(|s| -> anyhow::Result<()> {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    loop {
                        match store.maintain(now_ns()) {
                            Ok(r) if r.more => continue,
                            Ok(_) => break,
                            Err(e) => {
                                eprintln!("maintenance: {e}");
                                break;
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
            for w in 0..2usize {
                let (store, points, stop, series, index) = (&store, &points, &stop, &series, &index);
                s.spawn(move || {
                    let mut spans = std::collections::HashSet::new();
                    let mut i = 0u64;
                    // Each of the 2 writers sends 1,000-point batches at half the rate.
                    let every = Duration::from_secs_f64(2_000.0 / rate.max(1) as f64);
                    let began = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(wait) = (every * i as u32).checked_sub(began.elapsed()) {
                            std::thread::sleep(wait);
                        }
                        // 1,000 points: 10 for each of 100 series, stamped now.
                        let now = now_ns();
                        let mut batch = Vec::new();
                        for k in 0..100 {
                            let s = (w * 100 + k + (i as usize) * 200) % series.len();
                            let pts: Vec<Point> =
                                (0..10).map(|j| Point::new(now + j * 1_000 + w as i64, j as f64)).collect();
                            let q = data_len.quantum_of(now);
                            batch.push(BlockPoints { series: series[s].clone(), quantum: q, points: pts });
                            // The quantum index: one point per span of 64 quanta holding data.
                            let span = data_len.ns() * 64;
                            let span_start = now.div_euclid(span) * span;
                            if spans.insert((s, span_start)) {
                                let iq = index_len.quantum_of(span_start);
                                batch.push(BlockPoints {
                                    series: index[s].clone(),
                                    quantum: Quantum::at(iq.start, index_len).expect("aligned"),
                                    points: vec![Point::new(span_start, 0.0)],
                                });
                            }
                        }
                        if let Err(e) = store.write(&batch) {
                            eprintln!("write: {e}");
                            return;
                        }
                        points.fetch_add(1_000, Ordering::Relaxed);
                        i += 1;
                    }
                });
            }
            let mut last = 0;
            for t in 1..=seconds {
                std::thread::sleep(
                    Duration::from_secs(1).saturating_sub(start.elapsed().saturating_sub(Duration::from_secs(t - 1))),
                );
                if t % 10 == 0 || t == seconds {
                    let st = store.stats();
                    let p = points.load(Ordering::Relaxed);
                    println!(
                        "{t:>4} s: {:.0} k points/s, log {:.1} MB in {} segments, {} open points, {} frames, RSS {:.0} MB",
                        (p - last) as f64 / 1e3 / 10f64.min(t as f64),
                        st.wal_bytes as f64 / 1e6,
                        st.wal_segments,
                        st.open_points,
                        st.frames,
                        rss_mb()
                    );
                    last = p;
                }
            }
            stop.store(true, Ordering::Relaxed);
            Ok(())
        })?;
        println!(
            "ingested {} points in {:.0} s ({}); now restarting without a shutdown step",
            points.load(Ordering::Relaxed),
            start.elapsed().as_secs_f64(),
            if old { "checkpoints off" } else { "checkpoints on" }
        );
        // Dropped without any shutdown work: what a SIGKILL leaves is the same (every write
        // was durable when acknowledged).
    }
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(REOPEN).arg(&dir);
    if old {
        cmd.arg("--old");
    }
    let status = cmd.status()?;
    anyhow::ensure!(status.success(), "the reopening process failed");
    Ok(())
}
