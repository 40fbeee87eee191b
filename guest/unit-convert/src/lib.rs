//! Converts values between units on the way in, so a fleet stores one unit per metric.
//!
//! Config, either:
//! - `from` and `to`, two units of one dimension: temperature `degC`, `degF`, `K`; energy `J`,
//!   `Wh`, `kWh`, `MWh`; pressure `Pa`, `kPa`, `bar`, `psi`; voltage `mV`, `V`, `kV`;
//! - or `scale` and/or `offset`: `value * scale + offset` (defaults 1 and 0).
//!
//! Every point is kept; non-finite values stay non-finite.

#![no_std]
extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "ingest-policy", path: "../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::ingest::Guest;
use timeshard::policy::types::{IngestOutput, Points, Series, Setting};

/// A unit as `base = value * scale + offset` in its dimension's base unit.
struct Unit {
    name: &'static str,
    dimension: &'static str,
    scale: f64,
    offset: f64,
}

const UNITS: &[Unit] = &[
    Unit { name: "K", dimension: "temperature", scale: 1.0, offset: 0.0 },
    Unit { name: "degC", dimension: "temperature", scale: 1.0, offset: 273.15 },
    Unit { name: "degF", dimension: "temperature", scale: 5.0 / 9.0, offset: 273.15 - 32.0 * 5.0 / 9.0 },
    Unit { name: "J", dimension: "energy", scale: 1.0, offset: 0.0 },
    Unit { name: "Wh", dimension: "energy", scale: 3600.0, offset: 0.0 },
    Unit { name: "kWh", dimension: "energy", scale: 3.6e6, offset: 0.0 },
    Unit { name: "MWh", dimension: "energy", scale: 3.6e9, offset: 0.0 },
    Unit { name: "Pa", dimension: "pressure", scale: 1.0, offset: 0.0 },
    Unit { name: "kPa", dimension: "pressure", scale: 1e3, offset: 0.0 },
    Unit { name: "bar", dimension: "pressure", scale: 1e5, offset: 0.0 },
    Unit { name: "psi", dimension: "pressure", scale: 6_894.757_293_168, offset: 0.0 },
    Unit { name: "mV", dimension: "voltage", scale: 1e-3, offset: 0.0 },
    Unit { name: "V", dimension: "voltage", scale: 1.0, offset: 0.0 },
    Unit { name: "kV", dimension: "voltage", scale: 1e3, offset: 0.0 },
];

fn unit(setting: &str, name: &str) -> Result<&'static Unit, String> {
    UNITS.iter().find(|u| u.name == name).ok_or_else(|| {
        let known: Vec<&str> = UNITS.iter().map(|u| u.name).collect();
        format!("setting {setting:?}: unknown unit {name:?}; known units: {}", known.join(", "))
    })
}

/// The linear map `value * scale + offset` that the config asks for.
fn conversion(config: &[Setting]) -> Result<(f64, f64), String> {
    let get = |name| policy_guest::find(config.iter().map(|s| (&*s.name, &*s.value)), name);
    match (get("from"), get("to")) {
        (Some(from), Some(to)) => {
            let (f, t) = (unit("from", from)?, unit("to", to)?);
            if f.dimension != t.dimension {
                return Err(format!(
                    "cannot convert {from} ({}) to {to} ({})",
                    f.dimension, t.dimension
                ));
            }
            // value -> base -> target.
            Ok((f.scale / t.scale, (f.offset - t.offset) / t.scale))
        }
        (Some(_), None) | (None, Some(_)) => {
            Err("settings \"from\" and \"to\" go together; give both".to_string())
        }
        (None, None) => {
            let scale = policy_guest::number("scale", get("scale"), Some(1.0));
            let offset = policy_guest::number("offset", get("offset"), Some(0.0));
            if get("scale").is_none() && get("offset").is_none() {
                return Err(
                    "no conversion configured: set \"from\" and \"to\", or \"scale\" and/or \"offset\""
                        .to_string(),
                );
            }
            Ok((scale.map_err(|e| e.to_string())?, offset.map_err(|e| e.to_string())?))
        }
    }
}

struct Convert;

impl Guest for Convert {
    fn process(
        _: Series,
        config: Vec<Setting>,
        mut batch: Points,
    ) -> Result<IngestOutput, String> {
        let (scale, offset) = conversion(&config)?;
        for v in &mut batch.value {
            *v = *v * scale + offset;
        }
        Ok(IngestOutput {
            keep: batch,
            rejected: Vec::new(),
        })
    }
}

export!(Convert);
