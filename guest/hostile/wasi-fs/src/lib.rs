//! Hostile fixture: a plain `std` guest that reads a file, so its component imports
//! `wasi:filesystem` (and more of WASI). The host must refuse it when it is loaded.

use timeshard::policy::types::{IngestOutput, Point, Series, Setting};

wit_bindgen::generate!({ world: "ingest-policy", path: "../../../wit" });

use exports::timeshard::policy::ingest::Guest;

struct Hostile;

impl Guest for Hostile {
    fn process(_: Series, _: Vec<Setting>, batch: Vec<Point>) -> Result<IngestOutput, String> {
        let secret = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
        let keep = batch
            .into_iter()
            .map(|p| Point {
                value: secret.len() as f64,
                ..p
            })
            .collect();
        Ok(IngestOutput {
            keep,
            rejected: Vec::new(),
        })
    }
}

export!(Hostile);
