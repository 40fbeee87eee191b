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
use timeshard::policy::types::{IngestOutput, Point, Rejection, Series, Setting};

struct Validate;

fn setting(config: &[Setting], name: &'static str, default: f64) -> Result<f64, String> {
    let value = policy_guest::find(config.iter().map(|s| (&*s.name, &*s.value)), name);
    policy_guest::number(name, value, Some(default)).map_err(|e| e.to_string())
}

impl Guest for Validate {
    fn process(
        _: Series,
        config: Vec<Setting>,
        batch: Vec<Point>,
    ) -> Result<IngestOutput, String> {
        let min = setting(&config, "min", -1e6)?;
        let max = setting(&config, "max", 1e6)?;
        if min > max {
            return Err(format!("setting \"min\" ({min}) is above \"max\" ({max})"));
        }
        let mut keep = Vec::with_capacity(batch.len());
        let mut rejected = Vec::new();
        for (i, p) in batch.into_iter().enumerate() {
            let reason = if p.value.is_nan() {
                "value is NaN".to_string()
            } else if p.value.is_infinite() {
                "value is infinite".to_string()
            } else if p.value < min || p.value > max {
                format!("value {} is outside [{min}, {max}]", p.value)
            } else {
                keep.push(p);
                continue;
            };
            rejected.push(Rejection {
                index: i as u32,
                reason,
            });
        }
        // Identity order, as the store keeps points: time, event id, value bits.
        keep.sort_unstable_by_key(|p| (p.ts, p.event, p.value.to_bits()));
        keep.dedup_by_key(|p| (p.ts, p.event, p.value.to_bits()));
        Ok(IngestOutput { keep, rejected })
    }
}

export!(Validate);
