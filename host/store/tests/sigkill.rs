//! SIGKILL during sustained ingest, on real files: a child process writes batches with
//! maintenance running and prints each batch once `write` acknowledged it; the parent kills it
//! with SIGKILL at varying moments, reopens the directory and checks every acknowledged point.
//! Runs without the test harness so the binary can re-run itself as the child.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::{DiskConfig, DiskStore, Store};

const CHILD_ENV: &str = "TIMESHARD_SIGKILL_CHILD_DIR";
const POINTS: i64 = 200;
const STEP: i64 = 1_000_000; // 1 ms apart

fn key(writer: u32) -> SeriesKey {
    format!("kill{{w={writer}}}").parse().unwrap()
}

fn batch(writer: u32, round: u32, b: i64) -> Vec<BlockPoints> {
    let len = QuantumLen::new(100_000_000).unwrap();
    let first = b * POINTS * STEP;
    let mut out: Vec<BlockPoints> = Vec::new();
    for i in 0..POINTS {
        let ts = first + i * STEP;
        let p = Point { ts, value: (b * 1000 + i) as f64, event: u64::from(round) };
        let q = len.quantum_of(ts);
        match out.last_mut() {
            Some(bp) if bp.quantum == q => bp.points.push(p),
            _ => out.push(BlockPoints {
                series: key(writer),
                quantum: Quantum::at(q.start, len).unwrap(),
                points: vec![p],
            }),
        }
    }
    out
}

fn child(dir: &Path, round: u32) {
    let store = DiskStore::open(dir, DiskConfig::default()).expect("child opens the store");
    let clock = AtomicI64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                store.maintain(clock.load(Ordering::Relaxed)).expect("maintenance");
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        for w in 0..2u32 {
            let (store, clock) = (&store, &clock);
            s.spawn(move || {
                for b in 0.. {
                    store.write(&batch(w, round, b)).expect("child write");
                    clock.fetch_max((b + 1) * POINTS * STEP, Ordering::Relaxed);
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{w} {b}").unwrap();
                    out.flush().unwrap();
                }
            });
        }
    });
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let round = std::env::var("TIMESHARD_SIGKILL_ROUND").unwrap().parse().unwrap();
        child(Path::new(&dir), round);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked: Vec<(u32, u32, i64)> = Vec::new();
    for (round, after_ms) in [(1u32, 150u64), (2, 600), (3, 1200)] {
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, dir.path())
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
        assert!(!lines.is_empty(), "round {round}: the child acknowledged nothing in {:?}", start.elapsed());
        for l in &lines {
            let (w, b) = l.split_once(' ').unwrap();
            acked.push((w.parse().unwrap(), round, b.parse().unwrap()));
        }
        // Restart and check every acknowledged point so far, from every round.
        let store = DiskStore::open(dir.path(), DiskConfig::default()).unwrap();
        assert!(store.health().is_empty(), "{:?}", store.health());
        for w in 0..2u32 {
            let all = TimeRange::new(0, timeshard_proto::time::MAX_TIMESTAMP).unwrap();
            let mut got = BTreeSet::new();
            let mut after = None;
            loop {
                let page = store.read(&key(w), all, after, 100_000).unwrap();
                after = page.points.last().map(Point::key);
                got.extend(page.points.iter().map(Point::key));
                if !page.more {
                    break;
                }
            }
            for &(aw, r, b) in acked.iter().filter(|a| a.0 == w) {
                for bp in batch(aw, r, b) {
                    for p in bp.points {
                        assert!(got.contains(&p.key()), "round {round}: acknowledged point {p:?} of writer {w} lost");
                    }
                }
            }
        }
        println!("round {round}: killed after {after_ms} ms, {} acknowledged batches checked", acked.len());
    }
    println!("sigkill: 1 passed; 0 failed");
}
