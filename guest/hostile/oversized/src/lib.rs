//! Hostile fixture: returns ten copies of every point, more than an ingest policy may return.

#![no_std]
extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "ingest-policy", path: "../../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::ingest::Guest;
use timeshard::policy::types::{IngestOutput, Points, Series, Setting};

struct Hostile;

impl Guest for Hostile {
    fn process(_: Series, _: Vec<Setting>, batch: Points) -> Result<IngestOutput, String> {
        let mut keep = Points {
            ts: Vec::new(),
            value: Vec::new(),
            event: Vec::new(),
        };
        for _ in 0..10 {
            keep.ts.extend_from_slice(&batch.ts);
            keep.value.extend_from_slice(&batch.value);
            keep.event.extend_from_slice(&batch.event);
        }
        Ok(IngestOutput {
            keep,
            rejected: Vec::new(),
        })
    }
}

export!(Hostile);
