//! Hostile fixture: allocates and touches memory until the host's memory cap stops it.

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
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            // 1 MiB at a time, written so the pages are really used.
            hoard.push(alloc::vec![batch.ts.len() as u8 | 1; 1 << 20]);
            core::hint::black_box(&hoard);
        }
    }
}

export!(Hostile);
