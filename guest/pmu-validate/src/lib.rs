//! Ingest policy for phasor measurement units: refuses NaN, infinite and out-of-range values
//! (each listed with its reason) and removes exact duplicates (the same timestamp, event id and
//! value: storing them again would change nothing). Keeps the points sorted by time.
//!
//! Config: `min` and `max`, the accepted value range, inclusive (defaults -1e6 and 1e6).

#![no_std]
extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "ingest-policy", path: "../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::ingest::Guest;
use timeshard::policy::types::{IngestOutput, Points, Rejection, Series, Setting};

struct Validate;

fn setting(config: &[Setting], name: &'static str, default: f64) -> Result<f64, String> {
    let value = policy_guest::find(config.iter().map(|s| (&*s.name, &*s.value)), name);
    policy_guest::number(name, value, Some(default)).map_err(|e| e.to_string())
}

impl Guest for Validate {
    fn process(_: Series, config: Vec<Setting>, batch: Points) -> Result<IngestOutput, String> {
        let min = setting(&config, "min", -1e6)?;
        let max = setting(&config, "max", 1e6)?;
        if min > max {
            return Err(format!("setting \"min\" ({min}) is above \"max\" ({max})"));
        }
        let Points { ts, value, event } = batch;
        let n = ts.len();
        let mut keep = Points {
            ts: Vec::with_capacity(n),
            value: Vec::with_capacity(n),
            event: Vec::with_capacity(n),
        };
        let mut rejected = Vec::new();
        for i in 0..n {
            let v = value[i];
            let reason = if v.is_nan() {
                "value is NaN".to_string()
            } else if v.is_infinite() {
                "value is infinite".to_string()
            } else if v < min || v > max {
                format!("value {v} is outside [{min}, {max}]")
            } else {
                keep.ts.push(ts[i]);
                keep.value.push(v);
                keep.event.push(event[i]);
                continue;
            };
            rejected.push(Rejection {
                index: i as u32,
                reason,
            });
        }
        // Identity order, as the store keeps points: time, event id, value bits. A batch from
        // one device is usually sorted already.
        if !policy_guest::strictly_sorted(&keep.ts, &keep.value, &keep.event) {
            let mut rows = policy_guest::rows(&keep.ts, &keep.value, &keep.event);
            rows.sort_unstable_by_key(policy_guest::Row::key);
            rows.dedup_by_key(|r| r.key());
            let (ts, value, event) = policy_guest::columns(&rows);
            keep = Points { ts, value, event };
        }
        Ok(IngestOutput { keep, rejected })
    }
}

export!(Validate);
