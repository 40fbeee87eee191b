//! Root mean square of a series over a range, computed where the data lives.
//!
//! `summarize` reduces the points of one quantum to `numbers = [sum of squares, count]` (16 bytes
//! instead of 24 per point); `merge` adds the partials up and returns `rms` and `count`
//! (`rms` is left out when there are no points). Non-finite values are skipped.
//!
//! No parameters.

#![no_std]
extern crate alloc;

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "query-policy", path: "../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::query::Guest;
use timeshard::policy::types::{
    NamedValue, Partial, Points, QueryResult, Series, Setting, TimeRange,
};

struct Rms;

fn no_points() -> Points {
    Points {
        ts: Vec::new(),
        value: Vec::new(),
        event: Vec::new(),
    }
}

impl Guest for Rms {
    fn summarize(
        _: Series,
        range: TimeRange,
        _: Vec<Setting>,
        points: Points,
    ) -> Result<Partial, String> {
        let (mut sum_sq, mut count) = (0.0f64, 0u64);
        for v in points.value.iter().filter(|v| v.is_finite()) {
            sum_sq += v * v;
            count += 1;
        }
        Ok(Partial {
            range,
            numbers: vec![sum_sq, count as f64],
            points: no_points(),
        })
    }

    fn merge(_: Vec<Setting>, partials: Vec<Partial>) -> Result<QueryResult, String> {
        let (mut sum_sq, mut count) = (0.0f64, 0.0f64);
        for (i, p) in partials.iter().enumerate() {
            let [s, c] = p.numbers[..] else {
                return Err(alloc::format!(
                    "partial {i} has {} numbers; an rms partial has 2 (sum of squares, count)",
                    p.numbers.len()
                ));
            };
            sum_sq += s;
            count += c;
        }
        let mut values = vec![NamedValue {
            name: "count".into(),
            value: count,
        }];
        if count > 0.0 {
            values.push(NamedValue {
                name: "rms".into(),
                value: policy_guest::sqrt(sum_sq / count),
            });
        }
        Ok(QueryResult {
            values,
            points: no_points(),
        })
    }
}

export!(Rms);
