//! SIGKILL during sustained ingest, on real files: a child process writes batches with
//! maintenance running and prints each batch once `write` acknowledged it; the parent kills it
//! with SIGKILL at varying moments, reopens the directory and checks every acknowledged point.
//! The test re-runs its own binary, filtered to itself, as the child.
//!
//! Two modes, each in its own directory: old data (timestamps from 0 in 100 ms quanta, the
//! maintenance clock following the data), and live data (wall-clock timestamps in a 366-day
//! quantum that never ends during the test, the maintenance clock being the wall clock), where
//! the restart must also replay a bounded log.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use timeshard_clock::now_ns;
use timeshard_proto::point::BlockPoints;
use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::{DiskConfig, DiskStore, Store};

const CHILD_ENV: &str = "TIMESHARD_SIGKILL_CHILD_DIR";
const POINTS: i64 = 200;

/// Which data a child writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Timestamps from 0, 1 ms apart, in 100 ms quanta.
    Old,
    /// Timestamps from the round's start on the wall clock, 1 µs apart, in a 366-day quantum.
    Live,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Old => "old",
            Mode::Live => "live",
        }
    }

    fn parse(s: &str) -> Mode {
        if s == "live" { Mode::Live } else { Mode::Old }
    }

    fn step(self) -> i64 {
        match self {
            Mode::Old => 1_000_000,
            Mode::Live => 1_000,
        }
    }

    fn quantum(self) -> QuantumLen {
        match self {
            Mode::Old => QuantumLen::new(100_000_000).unwrap(),
            Mode::Live => timeshard_proto::key::index_quantum(),
        }
    }

    /// Live: small log segments and bounds, so a second of ingest shows whether the log is
    /// bounded.
    fn config(self) -> DiskConfig {
        match self {
            Mode::Old => DiskConfig::default(),
            Mode::Live => DiskConfig {
                max_open_age_ns: 100_000_000,
                wal_segment_bytes: 256 << 10,
                max_wal_bytes: 1 << 20,
                ..DiskConfig::default()
            },
        }
    }
}

fn key(mode: Mode, writer: u32) -> SeriesKey {
    format!("kill.{}{{w={writer}}}", mode.name()).parse().unwrap()
}

/// Batch `b` of `writer` in `round`, from timestamp `base` on.
fn batch(mode: Mode, base: i64, writer: u32, round: u32, b: i64) -> Vec<BlockPoints> {
    let len = mode.quantum();
    let first = base + b * POINTS * mode.step();
    let mut out: Vec<BlockPoints> = Vec::new();
    for i in 0..POINTS {
        let ts = first + i * mode.step();
        let p = Point { ts, value: (b * 1000 + i) as f64, event: u64::from(round) };
        let q = len.quantum_of(ts);
        match out.last_mut() {
            Some(bp) if bp.quantum == q => bp.points.push(p),
            _ => out.push(BlockPoints {
                series: key(mode, writer),
                quantum: Quantum::at(q.start, len).unwrap(),
                points: vec![p],
            }),
        }
    }
    out
}

fn child(dir: &Path, mode: Mode, base: i64, round: u32) {
    let store = DiskStore::open(dir, mode.config()).expect("child opens the store");
    let clock = AtomicI64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let now = match mode {
                    Mode::Old => clock.load(Ordering::Relaxed),
                    Mode::Live => now_ns(),
                };
                store.maintain(now).expect("maintenance");
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        for w in 0..2u32 {
            let (store, clock) = (&store, &clock);
            s.spawn(move || {
                for b in 0.. {
                    store.write(&batch(mode, base, w, round, b)).expect("child write");
                    clock.fetch_max(base + (b + 1) * POINTS * mode.step(), Ordering::Relaxed);
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{ACK}{w} {b}").unwrap();
                    out.flush().unwrap();
                }
            });
        }
    });
}

/// This test's name as the harness filters it, for the child to run only this test.
const NAME: &str = "sigkill::acknowledged_batches_survive_sigkill_mid_ingest";

/// What the child prints for each acknowledged batch: `ACK <writer> <batch>` (the harness
/// prints its own lines around them).
const ACK: &str = "ACK ";

#[test]
fn acknowledged_batches_survive_sigkill_mid_ingest() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let var = |name: &str| std::env::var(name).unwrap();
        let mode = Mode::parse(&var("TIMESHARD_SIGKILL_MODE"));
        child(
            Path::new(&dir),
            mode,
            var("TIMESHARD_SIGKILL_BASE").parse().unwrap(),
            var("TIMESHARD_SIGKILL_ROUND").parse().unwrap(),
        );
        return;
    }
    let rounds = [
        (Mode::Old, 1u32, 150u64),
        (Mode::Old, 2, 600),
        (Mode::Old, 3, 1200),
        (Mode::Live, 1, 300),
        (Mode::Live, 2, 1500),
        (Mode::Live, 3, 2500),
    ];
    let old_dir = tempfile::tempdir().unwrap();
    let live_dir = tempfile::tempdir().unwrap();
    // (mode, base, writer, round, batch) of every acknowledged batch.
    let mut acked: Vec<(Mode, i64, u32, u32, i64)> = Vec::new();
    for (mode, round, after_ms) in rounds {
        let dir = if mode == Mode::Old { old_dir.path() } else { live_dir.path() };
        let base = if mode == Mode::Old { 0 } else { now_ns() };
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir)
            .env("TIMESHARD_SIGKILL_MODE", mode.name())
            .env("TIMESHARD_SIGKILL_BASE", base.to_string())
            .env("TIMESHARD_SIGKILL_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = proc.stdout.take().unwrap();
        let reader =
            std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<String>>());
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(after_ms));
        proc.kill().unwrap(); // SIGKILL on Unix
        proc.wait().unwrap();
        let lines = reader.join().unwrap();
        let acks: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix(ACK)).collect();
        assert!(!acks.is_empty(), "{mode:?} round {round}: the child acknowledged nothing in {:?}", start.elapsed());
        for l in acks {
            let (w, b) = l.split_once(' ').unwrap();
            acked.push((mode, base, w.parse().unwrap(), round, b.parse().unwrap()));
        }
        // Restart and check every acknowledged point so far, from every round of this mode.
        let opened = Instant::now();
        let store = DiskStore::open(dir, mode.config()).unwrap();
        let opened = opened.elapsed();
        assert!(store.health().is_empty(), "{:?}", store.health());
        let stats = store.stats();
        for w in 0..2u32 {
            let all = TimeRange::new(0, timeshard_proto::time::MAX_TIMESTAMP).unwrap();
            let mut got = BTreeSet::new();
            let mut after = None;
            loop {
                let page = store.read(&key(mode, w), all, after, 100_000).unwrap();
                after = page.points.last().map(Point::key);
                got.extend(page.points.iter().map(Point::key));
                if !page.more {
                    break;
                }
            }
            for &(m, base, aw, r, b) in acked.iter().filter(|a| a.0 == mode && a.2 == w) {
                for bp in batch(m, base, aw, r, b) {
                    for p in bp.points {
                        assert!(
                            got.contains(&p.key()),
                            "{mode:?} round {round}: acknowledged point {p:?} of writer {w} lost"
                        );
                    }
                }
            }
        }
        let batches = acked.iter().filter(|a| a.0 == mode).count();
        println!(
            "{mode:?} round {round}: killed after {after_ms} ms, {batches} acknowledged batches checked; the \
             restart replayed {} bytes of log in {} segments ({} points) in {opened:?}",
            stats.wal_bytes, stats.wal_segments, stats.open_points
        );
        if mode == Mode::Live {
            // Every batch is about 2.2 kB of log, so a killed round has written megabytes. Past
            // twice the 1 MiB bound writers checkpoint themselves (so a loaded machine that
            // starves maintenance cannot break this), plus the segment being written (256 KiB).
            assert!(stats.wal_bytes < 3 << 20, "live round {round}: the restart replayed {} bytes", stats.wal_bytes);
        }
    }
}
