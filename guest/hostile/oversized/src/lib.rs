//! Hostile fixture: returns ten copies of every point, more than an ingest policy may return.

#![no_std]
extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "ingest-policy", path: "../../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::ingest::Guest;
use timeshard::policy::types::{IngestOutput, Point, Series, Setting};

struct Hostile;

impl Guest for Hostile {
    fn process(_: Series, _: Vec<Setting>, batch: Vec<Point>) -> Result<IngestOutput, String> {
        let mut keep = Vec::with_capacity(batch.len() * 10);
        for _ in 0..10 {
            keep.extend_from_slice(&batch);
        }
        Ok(IngestOutput {
            keep,
            rejected: Vec::new(),
        })
    }
}

export!(Hostile);
