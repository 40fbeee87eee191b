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
use timeshard::policy::types::{IngestOutput, Point, Rejection, Series, Setting};

struct Deadband;

impl Guest for Deadband {
    fn process(
        _: Series,
        config: Vec<Setting>,
        batch: Vec<Point>,
    ) -> Result<IngestOutput, String> {
        let d = policy_guest::find(config.iter().map(|s| (&*s.name, &*s.value)), "d");
        let d = policy_guest::number("d", d, None).map_err(|e| e.to_string())?;
        if d < 0.0 {
            return Err(format!("setting \"d\" is {d}; it must be at least 0"));
        }
        let mut rejected = Vec::new();
        let mut order: Vec<Point> = Vec::with_capacity(batch.len());
        for (i, p) in batch.into_iter().enumerate() {
            if p.value.is_finite() {
                order.push(p);
            } else {
                rejected.push(Rejection {
                    index: i as u32,
                    reason: "value is not finite: no deadband around it".to_string(),
                });
            }
        }
        order.sort_unstable_by_key(|p| (p.ts, p.event));
        let mut keep: Vec<Point> = Vec::with_capacity(order.len());
        let mut last: Option<f64> = None;
        for p in order {
            let outside = match last {
                None => true,
                Some(v) => {
                    let diff = p.value - v;
                    diff > d || diff < -d
                }
            };
            if outside {
                last = Some(p.value);
                keep.push(p);
            }
        }
        Ok(IngestOutput { keep, rejected })
    }
}

export!(Deadband);
