//! Hostile fixture: panics. The panic handler logs the message through the host, then traps.

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
        let empty: &[Point] = &[];
        // Index past the end of an empty slice: a typical policy bug.
        let p = empty[core::hint::black_box(batch.len())];
        Ok(IngestOutput {
            keep: alloc::vec![p],
            rejected: Vec::new(),
        })
    }
}

export!(Hostile);
