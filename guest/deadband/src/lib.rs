//! Deadband compression: in time order, keeps a point only when its value differs by more than
//! `d` from the last kept point. Points dropped this way are not rejections (they are
//! compressed away); non-finite values are rejected, since no band can be drawn around them.
//!
//! Every call sees one batch in a fresh instance, so the band restarts with each batch: the
//! first point of a batch is always kept.
//!
//! Config: `d`, the half-width of the band (required, at least 0).

#![no_std]
extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "ingest-policy", path: "../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::ingest::Guest;
use timeshard::policy::types::{IngestOutput, Points, Rejection, Series, Setting};

struct Deadband;

impl Guest for Deadband {
    fn process(_: Series, config: Vec<Setting>, batch: Points) -> Result<IngestOutput, String> {
        let d = policy_guest::find(config.iter().map(|s| (&*s.name, &*s.value)), "d");
        let d = policy_guest::number("d", d, None).map_err(|e| e.to_string())?;
        if d < 0.0 {
            return Err(format!("setting \"d\" is {d}; it must be at least 0"));
        }
        let mut rejected = Vec::new();
        let mut rows = Vec::with_capacity(batch.ts.len());
        for (i, row) in policy_guest::rows(&batch.ts, &batch.value, &batch.event)
            .into_iter()
            .enumerate()
        {
            if row.value.is_finite() {
                rows.push(row);
            } else {
                rejected.push(Rejection {
                    index: i as u32,
                    reason: "value is not finite: no deadband around it".to_string(),
                });
            }
        }
        if !rows.is_sorted_by_key(|r| (r.ts, r.event)) {
            rows.sort_by_key(|r| (r.ts, r.event));
        }
        let mut keep = Points {
            ts: Vec::new(),
            value: Vec::new(),
            event: Vec::new(),
        };
        let mut last: Option<f64> = None;
        for r in rows {
            let outside = match last {
                None => true,
                Some(v) => {
                    let diff = r.value - v;
                    diff > d || diff < -d
                }
            };
            if outside {
                last = Some(r.value);
                keep.ts.push(r.ts);
                keep.value.push(r.value);
                keep.event.push(r.event);
            }
        }
        Ok(IngestOutput { keep, rejected })
    }
}

export!(Deadband);
