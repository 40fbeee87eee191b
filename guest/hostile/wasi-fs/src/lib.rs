//! Hostile fixture: a plain `std` guest that reads a file, so its component imports
//! `wasi:filesystem` (and more of WASI). The host must refuse it when it is loaded.

use timeshard::policy::types::{IngestOutput, Points, Series, Setting};

wit_bindgen::generate!({ world: "ingest-policy", path: "../../../wit" });

use exports::timeshard::policy::ingest::Guest;

struct Hostile;

impl Guest for Hostile {
    fn process(_: Series, _: Vec<Setting>, batch: Points) -> Result<IngestOutput, String> {
        let secret = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
        let mut keep = batch;
        for v in &mut keep.value {
            *v = secret.len() as f64;
        }
        Ok(IngestOutput {
            keep,
            rejected: Vec::new(),
        })
    }
}

export!(Hostile);
