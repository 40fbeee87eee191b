//! Hostile fixture: never returns. The host must stop it at its deadline and keep serving.

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
        let mut x = batch.ts.len() as u64;
        loop {
            // black_box keeps the loop from being optimised into anything cleverer.
            x = core::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

export!(Hostile);
