//! An ingest policy that keeps every point as it is. The benchmark uses it to measure what a
//! policy call costs by itself (passing 1,000 points in and out).

#![no_std]
extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "ingest-policy", path: "../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::ingest::Guest;
use timeshard::policy::types::{IngestOutput, Points, Series, Setting};

struct Noop;

impl Guest for Noop {
    fn process(_: Series, _: Vec<Setting>, batch: Points) -> Result<IngestOutput, String> {
        Ok(IngestOutput {
            keep: batch,
            rejected: Vec::new(),
        })
    }
}

export!(Noop);
