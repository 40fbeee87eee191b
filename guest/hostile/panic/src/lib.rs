//! Hostile fixture: panics. The panic handler logs the message through the host, then traps.

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
        let empty: &[i64] = &[];
        // Index past the end of an empty slice: a typical policy bug.
        let ts = empty[core::hint::black_box(batch.ts.len())];
        Ok(IngestOutput {
            keep: Points {
                ts: alloc::vec![ts],
                value: alloc::vec![0.0],
                event: alloc::vec![0],
            },
            rejected: Vec::new(),
        })
    }
}

export!(Hostile);
