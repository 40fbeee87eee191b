//! The benchmark runs end to end (tiny sizes: it measures nothing here) and its JSON has
//! exactly the keys of shared/BENCHMARKS.md.

use std::path::PathBuf;
use std::time::Duration;

use timeshard_testkit::bench::policy_host as bench;

#[test]
fn the_report_has_the_documented_keys() {
    let opts = bench::Options {
        batches: 2,
        repetitions: 1,
        loop_samples: 2,
        pushdown_seconds: 60,
        // Generous for the measured calls (two busy cores); the loop keeps its 10 ms.
        limits: timeshard_policy::Limits { deadline: Duration::from_secs(10), ..Default::default() },
    };
    let guest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest");
    let report = bench::run(&guest_dir, &opts).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&json), ["call_overhead_ns", "instantiate_us", "loop_stop_ms_p99", "ns_per_point", "pushdown"]);
    assert_eq!(keys(&json["ns_per_point"]), ["native", "wasm_deadband", "wasm_validate"]);
    for k in ["policy", "span", "bytes_pushdown", "bytes_raw", "ms_pushdown", "ms_raw"] {
        assert!(json["pushdown"].get(k).is_some(), "pushdown.{k} missing");
    }
    let p = report.pushdown.unwrap();
    assert_eq!(p.policy, "rms");
    assert_eq!(p.points, 3600);
    assert_eq!(p.partials, 6);
    assert!(p.bytes_pushdown < p.bytes_raw);
}
