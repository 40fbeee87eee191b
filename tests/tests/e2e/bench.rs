//! `timeshard bench ...` end to end at tiny sizes (the figures mean nothing here): each writes
//! one JSON document with the keys of BENCHMARKS.md, the `floor` object included.

use std::path::Path;
use std::process::Command;

use crate::NODE;

/// Runs `timeshard bench <args> --json <dir>/out.json` and returns the document.
fn bench(dir: &Path, args: &[&str]) -> serde_json::Value {
    let json = dir.join("out.json");
    let out = Command::new(NODE)
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json)
        .env("TIMESHARD_NODE_LOG", "warn")
        .output()
        .expect("the binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "bench {args:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("floor: fsync"), "the summary shows the floor:\n{stdout}");
    serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON document")).expect("valid JSON")
}

fn assert_keys(doc: &serde_json::Value, keys: &[&str]) {
    for key in keys {
        assert!(doc.get(key).is_some(), "{key} missing from {doc}");
    }
}

fn assert_floor(doc: &serde_json::Value) {
    for key in ["fsync_p50_ms", "fsync_p99_ms", "quic_rtt_p50_ms", "quic_rtt_p99_ms"] {
        assert!(doc["floor"][key].as_f64().is_some_and(|v| v >= 0.0), "floor.{key} in {doc}");
    }
    assert!(doc["floor"]["quic_rtt_p50_ms"].as_f64().unwrap() > 0.0, "{doc}");
}

#[test]
fn bench_store_quick_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = bench(dir.path(), &["store", "--quick", "--dir", data.to_str().unwrap()]);
    assert_keys(
        &doc,
        &[
            "ingest_points_per_s",
            "bytes_per_point",
            "scan_points_per_s",
            "agg_day_1m_ms",
            "agg_year_1h_ms",
            "recovery_s_per_gb",
        ],
    );
    assert_keys(&doc["bytes_per_point"], &["pmu", "counter"]);
    assert_floor(&doc);
    assert!(!data.exists(), "the benchmark removes its data directory");
}

#[test]
fn bench_paper_small_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let args = ["paper", "--nodes", "7", "--writes", "20", "--read-reps", "2", "--ingest-secs", "1"];
    let day = ["--day-points", "20000", "--day-reps", "2"];
    let doc = bench(dir.path(), &[&args[..], &day[..], &["--dir", work.to_str().unwrap()]].concat());
    assert_keys(&doc, &["nodes", "writes", "reads", "ingest", "read_day", "floor"]);
    assert_eq!(doc["nodes"], 7);
    assert_eq!(doc["writes"].as_array().unwrap().len(), 6);
    assert_keys(&doc["writes"][0], &["format", "rf", "n", "p50_ms", "p99_ms", "mean_ms"]);
    let points: Vec<u64> = doc["reads"].as_array().unwrap().iter().map(|r| r["points"].as_u64().unwrap()).collect();
    assert_eq!(points, [600, 4800, 9000, 600, 4800, 9000]);
    assert_keys(&doc["ingest"], &["rf", "w", "batch", "points_per_s"]);
    assert_keys(&doc["read_day"], &["points", "p50_ms", "points_per_s"]);
    assert_eq!(doc["read_day"]["points"], 20_000);
    assert_floor(&doc);
}

#[test]
fn bench_policy_quick_writes_its_document() {
    let guest_dir = crate::guest_dir();
    let dir = tempfile::tempdir().unwrap();
    let args = ["policy", "--quick", "--nodes", "3", "--pushdown-seconds", "120", "--reps", "1"];
    let doc = bench(dir.path(), &[&args[..], &["--guest-dir", guest_dir.to_str().unwrap()]].concat());
    assert_keys(&doc, &["ns_per_point", "call_overhead_ns", "instantiate_us", "loop_stop_ms_p99", "pushdown", "floor"]);
    assert_keys(&doc["ns_per_point"], &["native", "wasm_validate", "wasm_deadband"]);
    assert_keys(&doc["pushdown"], &["policy", "span", "bytes_pushdown", "bytes_raw", "ms_pushdown", "ms_raw"]);
    assert_eq!(doc["pushdown"]["scope"], "cluster");
    assert_eq!(doc["pushdown"]["points"], 7200);
    assert_floor(&doc);
}

#[test]
fn bench_tier_quick_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = bench(dir.path(), &["tier", "--quick", "--dir", data.to_str().unwrap()]);
    assert_keys(
        &doc,
        &[
            "export_points_per_s",
            "parquet_bytes_per_point",
            "read_day_cold_ms",
            "read_day_hot_ms",
            "agg_year_1h_cold_ms",
        ],
    );
    assert_keys(&doc["parquet_bytes_per_point"], &["pmu", "counter"]);
    assert!(doc["export_points_per_s"].as_u64().is_some_and(|v| v > 0), "{doc}");
    assert_floor(&doc);
    assert!(!data.exists(), "the benchmark removes its data directory");
}

#[test]
fn bench_http_quick_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let doc = bench(dir.path(), &["http", "--quick", "--dir", work.to_str().unwrap()]);
    assert_keys(
        &doc,
        &[
            "line_protocol_points_per_s",
            "line_protocol_points_per_s_cluster",
            "remote_write_samples_per_s",
            "live_line_protocol_points_per_s",
            "live_overloaded_pct",
            "live_rss_mb_peak",
            "query_1m_windows_day_ms",
        ],
    );
    // Ten minutes of data: the reads of 10 s and 150 s in every format (1 h and the day are
    // left out as longer than the data).
    for key in [
        "read_http_10s_ms",
        "read_http_150s_ms",
        "read_http_csv_150s_ms",
        "read_http_arrow_150s_ms",
        "read_http_parquet_150s_ms",
        "read_sdk_150s_ms",
        "line_protocol_points_per_s",
        "line_protocol_points_per_s_cluster",
        "remote_write_samples_per_s",
        "live_line_protocol_points_per_s",
        "live_rss_mb_peak",
    ] {
        assert!(doc[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {doc}");
    }
    // Ten minutes of 60 Hz data, every point counted by the query.
    assert_eq!(doc["query_points"], 36_000);
    assert_floor(&doc);
}

/// Its name holds `hostile_`, so `scripts/test` runs it with the attack scenarios, alone.
#[test]
fn bench_hostile_quick_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let doc = bench(dir.path(), &["hostile", "--quick", "--dir", work.to_str().unwrap()]);
    assert_keys(&doc, &["baseline_p99_ms", "attacks", "worst_p99_ratio", "max_peak_rss_bytes", "budget_bytes"]);
    let attacks = doc["attacks"].as_array().expect("a list of attacks");
    assert_eq!(attacks.len(), 10, "{doc}");
    for a in attacks {
        assert_eq!(a["survived"], true, "{a}");
        assert!(a["reads"].as_u64().is_some_and(|n| n > 0), "the client was served during {a}");
        assert!(a["quic_reads"].as_u64().is_some_and(|n| n > 0), "the QUIC client was served during {a}");
        assert!(a["p99_ratio"].as_f64().is_some_and(|r| r > 0.0), "{a}");
        assert!(a["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{a}");
    }
    let got = |name: &str, what: &str| {
        let a = attacks.iter().find(|a| a["attack"] == name).expect(name);
        a["statuses"][what].as_u64().unwrap_or(0)
    };
    // Every nested envelope is refused as malformed, never answered.
    assert!(got("located_nested_100000", "Malformed") > 0, "{doc}");
    assert_eq!(got("located_nested_100000", "answered"), 0, "{doc}");
    // The per-certificate cap refuses most of a round of 300.
    assert!(got("quic_idle_connections", "refused") >= 200, "{doc}");
    assert_eq!(doc["budget_bytes"], 256 << 20);
    assert_floor(&doc);
}

#[test]
fn bench_repair_quick_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let doc = bench(dir.path(), &["repair", "--quick", "--dir", work.to_str().unwrap()]);
    assert_keys(
        &doc,
        &[
            "restore_rf_s_per_gb",
            "rebalance_mb_per_s",
            "anti_entropy_idle_bytes_per_s_per_node",
            "hint_replay_points_per_s",
            "lost_acked_points",
            "wal_bytes_after_10min_live",
        ],
    );
    assert_eq!(doc["lost_acked_points"], 0, "{doc}");
    assert!(doc["wal_bytes_after_10min_live"].as_u64().is_some_and(|b| b > 0), "{doc}");
    assert_floor(&doc);
}

#[test]
fn bench_footprint_quick_writes_its_document() {
    let guest_dir = crate::guest_dir();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let sizes = dir.path().join("no-sizes.json");
    let args = ["footprint", "--quick", "--dir", work.to_str().unwrap(), "--sizes", sizes.to_str().unwrap()];
    let doc = bench(dir.path(), &[&args[..], &["--guest-dir", guest_dir.to_str().unwrap()]].concat());
    let figures = [
        "idle_rss_mb",
        "idle_rss_mb_with_policies",
        "rss_mb_at_10k_points_per_s",
        "cpu_pct_per_1k_points_per_s",
        "policy_ns_per_point_pulley",
        "policy_ns_per_point_cranelift",
        "vsz_mb",
    ];
    for key in figures {
        assert!(doc[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {doc}");
    }
    // Without cross builds, the binary under test is the only one measured.
    let binaries = doc["binary_mb"].as_object().unwrap();
    assert_eq!(binaries.len(), 1, "{doc}");
    assert!(binaries.values().all(|v| v.as_f64().is_some_and(|mb| mb > 1.0)), "{doc}");
    assert!(doc["ingest"]["points_per_s"].as_f64().is_some_and(|r| r > 0.0), "{doc}");
    assert_floor(&doc);
}

#[test]
fn bench_coi_quick_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let doc = bench(dir.path(), &["coi", "--quick", "--dir", work.to_str().unwrap()]);
    assert_keys(&doc, &["runs", "region_failure", "load_balance", "out_coi_km_p50"]);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 27, "3 modes x 3 read ratios x 3 distributions");
    for run in runs {
        assert_keys(
            run,
            &[
                "mode",
                "read_pct",
                "distribution",
                "read_p50_ms",
                "read_p95_ms",
                "read_p99_ms",
                "update_p50_ms",
                "update_p95_ms",
                "update_p99_ms",
                "ops_per_s",
                "stale_read_pct",
            ],
        );
    }
    assert!(doc["region_failure"]["readable_pct"].as_f64().is_some());
    assert!(doc["out_coi_km_p50"].as_f64().unwrap() > 0.0);
    // A cluster per seed, each with ids of its own; across them, each mode's median and range.
    let seeds = doc["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2, "--quick runs seeds 1 and 2");
    assert_ne!(seeds[0]["node_ids"], seeds[1]["node_ids"]);
    for mode in ["coi", "quorum", "eventual"] {
        let p99 = &doc["modes"][mode]["update_p99_ms"];
        let [lo, hi] = [0, 1].map(|i| p99["range"][i].as_f64().unwrap());
        assert!(lo > 0.0 && lo <= hi, "{mode}: {p99}");
        assert_eq!(p99["seed_medians"].as_array().unwrap().len(), 2, "{mode}: {p99}");
    }
    assert_floor(&doc);
}
